"""InProcessGroup: the ranks of a dry run as threads of one process, one per pipeline stage.

`plan --pp-size N` plans every stage the way N processes under torchrun would: each stage
bootstraps in a thread of its own and the stages agree through RankAgreement's very
collectives (free memory, tokens, failures), exchanged here over a barrier instead of a
process group. The TP ranks of one stage hold the same shards, so one thread stands for them.
"""

from __future__ import annotations

import threading
from typing import Any

COLLECTIVE_TIMEOUT_S = 300.0  # as app.parallel_setup's: a stage that takes this long to reach a collective is stuck


class InProcessGroup:
    """An all-gather among `world_size` threads; `abort()` frees every thread waiting at a collective."""

    one_rank_per_stage = True  # ParallelState: ranks are pipeline stages, numbered 0..pp_size-1

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=COLLECTIVE_TIMEOUT_S)
        self._slots: list[Any] = [None] * world_size

    def all_gather(self, rank: int, value: Any) -> list[Any]:
        """Every member's `value`, indexed by member; raises threading.BrokenBarrierError after abort()."""
        self._slots[rank] = value
        self._barrier.wait()
        gathered = list(self._slots)
        self._barrier.wait()  # no member writes its next value before every member has read this one
        return gathered

    def gather_int64(self, rank: int, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every member's int64s (kvcache.inputs.rank_agreement.RankGroup)."""
        return self.all_gather(rank, values)

    def min_int64(self, rank: int, values: tuple[int, ...]) -> tuple[int, ...]:
        """The element-wise smallest over the members."""
        return tuple(min(column) for column in zip(*self.all_gather(rank, values)))

    def gather_objects(self, rank: int, obj: Any) -> list[Any]:
        """Every member's object."""
        return self.all_gather(rank, obj)

    def abort(self) -> None:
        """A member failed outside a collective: release the others (they raise BrokenBarrierError)."""
        self._barrier.abort()
