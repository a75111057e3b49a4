"""Byte counts: parse '80GiB'-style sizes into ints and format ints for people.

Bytes are integers everywhere; GiB appear only in what is printed.
"""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": KiB,
    "m": 10**6, "mb": 10**6, "mib": MiB,
    "g": 10**9, "gb": 10**9, "gib": GiB,
    "t": 10**12, "tb": 10**12, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920; '1.5GB' -> 1500000000; '4096' -> 4096. Raises ValueError."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size: use a number with an optional unit, "
            "e.g. 80GiB, 40GB, 512MiB or 1073741824"
        )
    number = match.group(1)
    whole, _, frac = number.partition(".")
    scale = _UNITS[unit]
    return int(whole) * scale + (int(frac) * scale) // (10 ** len(frac)) if frac else int(whole) * scale


def format_bytes(n: int) -> str:
    """'1.50 GiB (1,610,612,736 B)': GiB for people, exact bytes beside them."""
    return f"{n / GiB:.2f} GiB ({n:,} B)"
