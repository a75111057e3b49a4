"""FreeStack: the free ids of a pool, as a preallocated int64 tensor with a top pointer.

pop(n) and push(ids) touch only n entries, so their cost does not grow with the pool
(SGLang concatenates every freed batch onto the whole free list). backup() is O(1):
it records the top and starts a journal; while it is live, pop saves the segment it
exposes below the lowest top seen, and restore() writes those segments back, so a
restore costs what changed since the backup, not the pool size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class FreeStackState:
    """An opaque backup: which stack, which backup generation, and the top then."""

    owner: int
    generation: int
    top: int


class FreeStack:
    """Ids 1..capacity, all free at first; pop hands out the lowest ids first."""

    def __init__(self, *, capacity: int, device: torch.device, check: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"a free list needs at least one id, got capacity {capacity}")
        self.capacity = capacity
        self.device = device
        self._stack = torch.arange(capacity, 0, -1, dtype=torch.int64, device=device)
        self._top = capacity
        self._check = check and device.type != "meta"
        self._is_free = torch.ones(capacity + 1, dtype=torch.bool, device=device) if self._check else None
        if self._is_free is not None:
            self._is_free[0] = False
        self._generation = 0
        self._backup_top: int | None = None
        self._low = 0
        self._journal: list[tuple[int, torch.Tensor]] = []

    @property
    def available(self) -> int:
        return self._top

    @property
    def nbytes(self) -> int:
        return self._stack.numel() * 8 + (self._is_free.numel() if self._is_free is not None else 0)

    def pop(self, n: int) -> torch.Tensor | None:
        """n free ids (ascending), or None when fewer are free."""
        if n > self._top:
            return None
        new_top = self._top - n
        if self._backup_top is not None and new_top < self._low:
            self._journal.append((new_top, self._stack[new_top:self._low].clone()))
            self._low = new_top
        out = self._stack[new_top:self._top].flip(0)
        self._top = new_top
        if self._is_free is not None:
            self._is_free[out] = False
        return out

    def push(self, ids: torch.Tensor) -> None:
        """Return ids to the free list."""
        n = ids.numel()
        if n == 0:
            return
        if self._is_free is not None:
            self._validate(ids)
            self._is_free[ids] = True
        if self._top + n > self.capacity:
            raise ValueError(f"freeing {n} ids onto {self._top} free of {self.capacity}: some were never allocated")
        self._stack[self._top:self._top + n] = ids.to(torch.int64).flip(0)
        self._top += n

    def _validate(self, ids: torch.Tensor) -> None:
        assert self._is_free is not None
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 1 or hi > self.capacity:
            raise ValueError(f"freeing id {lo if lo < 1 else hi}, outside 1..{self.capacity} (0 is padding)")
        if int(torch.unique(ids).numel()) != ids.numel():
            raise ValueError(f"freeing {ids.numel()} ids with duplicates among them")
        already = ids[self._is_free[ids]]
        if already.numel():
            raise ValueError(f"double free: id {int(already[0])} is already free ({already.numel()} such ids)")

    def reset(self) -> None:
        """Everything free again; any backup is void."""
        self._stack.copy_(torch.arange(self.capacity, 0, -1, dtype=torch.int64, device=self.device))
        self._top = self.capacity
        if self._is_free is not None:
            self._is_free.fill_(True)
            self._is_free[0] = False
        self._end_backup()

    def backup(self) -> FreeStackState:
        self._generation += 1
        self._backup_top = self._low = self._top
        self._journal = []
        return FreeStackState(owner=id(self), generation=self._generation, top=self._top)

    def restore(self, state: FreeStackState) -> None:
        if state.owner != id(self) or state.generation != self._generation or self._backup_top is None:
            raise ValueError("this allocator state is not the latest backup of this allocator (a newer backup or a clear() replaced it)")
        for start, segment in reversed(self._journal):
            self._stack[start:start + segment.numel()] = segment
        self._top = state.top
        self._low = state.top
        self._journal = []
        if self._is_free is not None:
            self._is_free.fill_(False)
            self._is_free[self._stack[: self._top]] = True

    def _end_backup(self) -> None:
        self._generation += 1
        self._backup_top = None
        self._journal = []
