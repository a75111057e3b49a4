"""Byte counts: parse '80GiB'-style sizes into ints and format ints for people.

Bytes are integers everywhere; GiB appear only in what is printed.

Sizes are binary: K, M, G, T, P with or without 'B' or 'iB' mean powers of 1024, so
'80GB', '80G' and '80GiB' are all 80 * 2**30 bytes. That is what an operator means:
an "80GB" H100 has 80 GiB of HBM (nvidia-smi shows 81559 MiB after the driver's
share), nvidia-smi counts in MiB, and SGLang's "GB" figures divide by 1 << 30.
"""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
PiB = 1 << 50

SIZE_UNITS_HELP = "a SIZE is 80GB, 80GiB or 80G (each 80 * 2^30 bytes, as nvidia-smi and SGLang count), 512MiB, or bytes"

_SCALE = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB, "p": PiB}
_SIZE = re.compile(r"(\d+)(?:\.(\d+))?\s*([kmgtp]?)(i?b)?", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """'80GiB', '80GB', '80G' -> 85899345920; '1.5GiB' -> 1610612736; '4096' -> 4096. Raises ValueError."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or (match.group(4) and match.group(4).lower() == "ib" and not match.group(3)):
        raise ValueError(
            f"cannot read {text!r} as a size: use a whole number with an optional unit, "
            "e.g. 80GiB, 80GB or 80G (all mean 80 * 2^30 bytes), 512MiB, or 1073741824 bytes"
        )
    whole, frac, unit = match.group(1), match.group(2) or "", match.group(3).lower()
    scale = _SCALE[unit]
    numerator = int(whole + frac) * scale
    denominator = 10 ** len(frac)
    if numerator % denominator:
        raise ValueError(f"{text!r} is not a whole number of bytes; give it in a smaller unit")
    return numerator // denominator


def format_bytes(n: int) -> str:
    """'1.50 GiB (1,610,612,736 B)': GiB for people, exact bytes beside them."""
    return f"{n / GiB:.2f} GiB ({n:,} B)"
