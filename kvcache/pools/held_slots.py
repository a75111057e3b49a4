"""Host-side checked release of numbered slots (request rows, recurrent-state slots): one rule for both pools."""

from __future__ import annotations

from collections.abc import Sequence


def release_held(held: bytearray, slots: Sequence[int], unit: str) -> None:
    """Mark slots free in `held` (one flag per slot, slot 0 the padding); refuses, changing nothing, padding slot 0,
    a slot out of range, one already free and one named twice: a slot freed twice would be handed out twice."""
    last = len(held) - 1
    for slot in slots:
        if not 1 <= slot <= last:
            raise ValueError(f"{unit} {slot} is not in 1..{last}")
        if not held[slot]:
            raise ValueError(f"double free: {unit} {slot} is already free")
    if len(set(slots)) != len(slots):
        raise ValueError(f"a {unit} is freed twice in one call: {sorted(slots)}")
    for slot in slots:
        held[slot] = 0
