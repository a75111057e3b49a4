"""FreeStack: the free ids (tokens or pages) of one pool, with per-call cost independent of pool size.

Layout: a preallocated int64 tensor `ids` of length capacity and a host-side int
`head`. The free ids are exactly ids[head:capacity]; ids[:head] is scratch.

- pop(n)   hands out ids[head:head+n] and moves head up: O(n), no host sync.
- push(xs) writes xs into ids[head-len:head] and moves head down: O(len), no sync.
  (SGLang's allocator frees with torch.cat onto the whole free list: O(pool).)
  Freed ids are handed out again first (LIFO), which keeps hot rows hot.

backup() is O(1): it records head (h0) and starts a journal. Only pop can expose
positions at or above h0 for later overwriting, because push writes only just below
head, and head never passes the highest head seen since the backup (`saved_hi`).
So while a backup is live, pop copies ids[saved_hi:new_head] into the journal the
first time head climbs past saved_hi (O(n) for that call). restore() writes the
journal back over ids[h0:saved_hi] and resets head to h0: its cost is what was
allocated past the backup point, never the pool size. Positions >= saved_hi were
never written, so the free set is exactly the one at backup. Only the latest backup
is restorable; the journal is bounded by the pool (it never covers past capacity).

With check=True a bool `is_free` row per id catches double frees, out-of-range ids
and id 0 (the padding row) at O(n) per call; it costs host syncs, so it is opt-in.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from kvcache import device_buffers

_serials = itertools.count(1)


@dataclass(frozen=True, slots=True)
class FreeStackState:
    """An opaque backup: which stack made it, which backup generation, and the head then."""

    owner: int
    generation: int
    head: int


class FreeStack:
    """Ids 1..capacity, all free at first; pop hands out the lowest ids first on a fresh stack."""

    def __init__(self, *, capacity: int, device: torch.device, unit: str, check: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"a free list needs at least one {unit}, got capacity {capacity}")
        if check and device.type == "meta":
            raise ValueError("check_frees=True needs real tensors, but a meta allocator holds no index values")
        self._capacity = capacity
        self._device = device
        self._unit = unit
        self._ids = device_buffers.allocate_zeros((capacity,), torch.int64, device)
        self._ids.copy_(torch.arange(1, capacity + 1, dtype=torch.int64, device=device))
        self._head = 0
        self._is_free: torch.Tensor | None = None
        if check:
            self._is_free = device_buffers.allocate_zeros((capacity + 1,), torch.bool, device)
            self._is_free.fill_(True)
            self._is_free[0] = False
        self._serial = next(_serials)
        self._generation = 0
        self._backup_head: int | None = None
        self._saved_hi = 0
        self._journal: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def available(self) -> int:
        """How many ids are free."""
        return self._capacity - self._head

    @property
    def nbytes(self) -> int:
        """Device bytes held for the life of the stack (kvcache.allocators.footprint states the formula)."""
        return device_buffers.tensor_bytes(t for t in (self._ids, self._is_free) if t is not None)

    def pop(self, n: int, *, copy: bool = True) -> torch.Tensor | None:
        """n free ids, or None (nothing changes) when fewer are free.

        copy=False returns a view that the next push may overwrite: for callers that
        consume it at once (the paged allocator turns pages into token indices).
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of {self._unit}s ({n})")
        if n > self.available:
            return None
        end = self._head + n
        if self._backup_head is not None and end > self._saved_hi:
            self._journal.append(self._ids[self._saved_hi:end].clone())
            self._saved_hi = end
        out = self._ids[self._head:end]
        self._head = end
        if self._is_free is not None:
            self._is_free[out] = False
        return out.clone() if copy else out

    def push(self, ids: torch.Tensor) -> None:
        """Return ids (1-D int64 on this device) to the free list."""
        n = ids.numel()
        if n == 0:
            return
        if self._is_free is not None:
            self._validate(ids)
        if n > self._head:
            raise ValueError(
                f"freeing {n} ids ({self._unit}) but only {self._head} are allocated "
                "(a double free? check_frees=True names the id)"
            )
        if self._is_free is not None:
            self._is_free[ids] = True
        self._ids[self._head - n:self._head] = ids
        self._head -= n

    def _validate(self, ids: torch.Tensor) -> None:
        """Raise ValueError naming the first bad id: padding 0, out of range, repeated, or already free."""
        assert self._is_free is not None
        unit = self._unit
        if bool((ids == 0).any()):
            raise ValueError(f"cannot free {unit} 0: it is the padding {unit} and is never handed out")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 1 or hi > self._capacity:
            raise ValueError(f"cannot free {unit} {lo if lo < 1 else hi}: out of range 1..{self._capacity}")
        ordered = ids.sort().values
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if repeated.numel():
            raise ValueError(f"{unit} {int(repeated[0])} is freed twice in one call")
        already = ids[self._is_free[ids]]
        if already.numel():
            raise ValueError(f"double free: {unit} {int(already[0])} is already free ({already.numel()} such)")

    def reset(self) -> None:
        """Everything free again, in the fresh order; any backup becomes void."""
        self._ids.copy_(torch.arange(1, self._capacity + 1, dtype=torch.int64, device=self._device))
        self._head = 0
        if self._is_free is not None:
            self._is_free.fill_(True)
            self._is_free[0] = False
        self._generation += 1
        self._backup_head = None
        self._journal = []

    def backup(self) -> FreeStackState:
        """O(1): remember head and start journaling; voids any earlier backup."""
        self._generation += 1
        self._backup_head = self._saved_hi = self._head
        self._journal = []
        return FreeStackState(owner=self._serial, generation=self._generation, head=self._head)

    def restore(self, state: FreeStackState) -> None:
        """Make the free set what it was at `state`; costs what was allocated past the backup point."""
        if state.owner != self._serial or state.generation != self._generation or self._backup_head is None:
            raise ValueError(
                f"allocator state (backup #{state.generation}) is not the latest backup of this allocator "
                f"(latest is #{self._generation}; a newer backup_state() or a clear() replaced it)"
            )
        h0, hi = state.head, self._saved_hi
        if self._is_free is not None and hi > self._head:
            self._is_free[self._ids[self._head:hi]] = False
        if self._journal:
            self._ids[h0:hi] = torch.cat(self._journal) if len(self._journal) > 1 else self._journal[0]
        if self._is_free is not None and hi > h0:
            self._is_free[self._ids[h0:hi]] = True
        self._head = self._saved_hi = h0
        self._journal = []
