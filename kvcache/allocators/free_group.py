"""FreeGroup: frees collected between free_group_begin() and free_group_end(), released together.

The scheduler frees many finished requests in one step; one release of the
concatenation is cheaper than many. Allocators defer their own items (copies of the
caller's tensors, as SGLang 0.5.23 does, so a tensor overwritten before the group
ends cannot change what is freed). The group is part of an allocator's backup:
restoring a state taken inside a group reopens it with the frees pending then, and
restoring one taken outside closes it, so a restore never frees anything twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FreeGroupState:
    """An opaque backup: the pending list then (None: no group open) and its length."""

    pending: list[Any] | None
    count: int


class FreeGroup:
    """At most one open group; nesting is an error (SGLang 0.5.23 asserts the same)."""

    def __init__(self) -> None:
        self._pending: list[Any] | None = None

    @property
    def is_open(self) -> bool:
        return self._pending is not None

    def begin(self) -> None:
        if self._pending is not None:
            raise ValueError(
                f"free_group_begin() while a free group is open ({len(self._pending)} frees pending); "
                "call free_group_end() first"
            )
        self._pending = []

    def defer(self, item: Any) -> None:
        """Keep an item (an owned copy of what to free) for the group's end."""
        assert self._pending is not None, "defer() outside a free group"
        self._pending.append(item)

    def end(self) -> list[Any]:
        """Close the group; the items to release now, in the order they came."""
        if self._pending is None:
            raise ValueError("free_group_end() without an open free group (call free_group_begin() first)")
        pending, self._pending = self._pending, None  # the old list stays intact for any backup that holds it
        return list(pending)

    def close(self) -> None:
        """Drop the group and whatever it collected (clear() does this)."""
        self._pending = None

    def mark(self) -> FreeGroupState:
        return FreeGroupState(pending=self._pending, count=0 if self._pending is None else len(self._pending))

    def restore(self, state: FreeGroupState) -> None:
        """Back to the group as it was at mark(); costs the frees collected since."""
        if state.pending is not None:
            del state.pending[state.count:]
        self._pending = state.pending
