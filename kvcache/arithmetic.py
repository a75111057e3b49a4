"""Exact integer arithmetic every stage shares: ceilings, page alignment, a decimal knob as a ratio.

The ground floor (beside kvcache.errors): it imports nothing of kvcache, so inputs, models,
memory, sizing and the stages above them state a ceiling or an alignment here once instead of
writing `-(-n // d)` again.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any


def ceil_div(n: Any, d: int) -> Any:
    """ceil(n / d) for d >= 1 and n an int (or an integer tensor): exact, no float."""
    return -(-n // d)


def align_up(n: int, step: int) -> int:
    """The smallest multiple of `step` that is >= n."""
    return ceil_div(n, step) * step


def align_down(n: int, step: int) -> int:
    """The largest multiple of `step` that is <= n."""
    return n // step * step


def exact_fraction(x: float) -> Fraction:
    """0.88 -> 22/25: a decimal knob as the exact ratio a person meant, not its binary float."""
    return Fraction(repr(x))
