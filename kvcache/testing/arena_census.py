"""ArenaCensus: which arenas made while it was installed are still alive (a failed build must leave none).

Arenas are passed explicitly and kept in no registry, so a test that asks "was everything freed?" counts
them here: `with ArenaCensus().installed() as census: ...`, then `census.alive()` after the objects that held
them are gone.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from kvcache.memory.device_buffers import Arena


class ArenaCensus:
    """Weak references to every Arena constructed while installed."""

    def __init__(self) -> None:
        self._made: list[weakref.ref[Arena]] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator["ArenaCensus"]:
        """Inside, each Arena that finishes construction is counted; outside, Arena is as it was."""
        real = Arena.__init__

        def counted(arena: Arena, *args: Any, **kwargs: Any) -> None:
            real(arena, *args, **kwargs)
            self._made.append(weakref.ref(arena))

        Arena.__init__ = counted  # type: ignore[method-assign]
        try:
            yield self
        finally:
            Arena.__init__ = real  # type: ignore[method-assign]

    @property
    def made(self) -> int:
        return len(self._made)

    def alive(self) -> int:
        """How many of them something still references (collect garbage first to count only reachable ones)."""
        return sum(ref() is not None for ref in self._made)
