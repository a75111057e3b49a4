"""FreeLog: the free ids of one pool in an append-only device log; alloc hands out views, free appends.

Layout: TWO int64 logs of 2 * capacity entries each, one of them active, and host ints head <= tail; the free
ids are exactly active[head:tail]. The log is given its planned slots (kvcache.sizing.allocator_footprint.
free_log_slots, its part of the plan's tensor list) and reads its capacity, and whether it checks frees, from
them; its buffers are the views of those slots the builder carved from the worker's arena (or, given none,
carved from an arena of its own: kvcache.pools.planned_views).

- take(n)  returns the view log[head:head+n] and moves head up: no kernel, no sync.
- put(xs)  copies xs into log[tail:tail+len] and moves tail up: one kernel, no sync
  (put_all: several tensors, concatenated straight into the log, also one kernel).
  When the active log's end is reached, the free ids (at most `capacity`) are copied to
  the front of the OTHER log, which becomes active (a compaction: one copy, at most once
  per `capacity` freed ids, so O(1) amortized per id). No memory is allocated after
  construction.

The guarantee: nothing writes at or below head of the active log, so a view take()
handed out keeps its values until at least `capacity` more ids have been freed. Its log
is written again only by the compaction after next: the next compaction leaves at least
`capacity` free entries in the other log (2 * capacity long, at most capacity ids
copied), so filling it takes at least `capacity` frees. SGLang's callers consume
alloc()'s result within a step (it is written into req_to_token), far inside that
bound. This is what makes alloc() a view and an alloc+free cycle one kernel launch at
page size 1, flat in the pool size.

backup() is O(1): which log, head and tail. Until a compaction writes into that log
again (two compactions later), its [head:tail] is untouched and restore() just
reinstates them (indices handed out after the backup are void once restored). If that
second compaction comes first, it copies the backup's free ids aside (transient, at
most capacity * 8 B, and only then), and restore() copies them to the front of the
inactive log. Only the latest backup is restorable.

Ids are multiples of `stride` (page starts in a paged pool: page p is stored as
p * page_size). With check=True a bool `is_free` row per id catches double frees,
out-of-range ids and id 0 (the padding page) at O(n) per call; it costs host syncs, so
it is opt-in, and restore() then rebuilds the flags (O(capacity)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvcache.allocators.given import planned_free_list
from kvcache.sizing.allocator_footprint import FREE_LOGS, LOG_LENGTH_FACTOR
from kvcache.sizing.tensor_plan import PlannedSlot
from kvcache.allocators.backups import BackupState, LatestBackup
from kvcache.pools.planned_views import Views, slots_nbytes, take_views


@dataclass(frozen=True, slots=True)
class FreeLogState(BackupState):
    """An opaque backup: which FreeLog made it and which backup generation (the log keeps the rest)."""


@dataclass(slots=True)
class _Saved:
    """Where the latest backup's free ids live: logs[index][head:tail], or `spill` once that log was rewritten."""

    index: int
    head: int
    tail: int
    spill: torch.Tensor | None = None


class FreeLog:
    """Ids stride*1 .. stride*capacity, all free at first; a fresh log hands out the lowest first. `slots` are its
    planned slots (planned_free_list: the capacity and the is_free flags are theirs); its buffers the views of
    their tensors in `views`, or, given None, its own."""

    def __init__(self, *, slots: Sequence[PlannedSlot], device: torch.device, unit: str, stride: int = 1,
                 views: Views | None = None) -> None:
        capacity, check = planned_free_list(slots, unit)
        if check and device.type == "meta":
            raise ValueError("check_frees=True needs real tensors, but a meta allocator holds no index values")
        self._capacity = capacity
        self._device = device
        self._unit = unit
        self._stride = stride
        self._slots = tuple(slots)
        self._views = take_views(self._slots, views, device)
        self._logs = tuple(self._views[:FREE_LOGS])
        self._active = 0
        self._log = self._logs[0]
        self._length = LOG_LENGTH_FACTOR * capacity
        self._saved: _Saved | None = None
        self._is_free: torch.Tensor | None = self._views[FREE_LOGS] if check else None
        self._backups = LatestBackup()
        self._head = self._tail = 0
        if device.type == "cpu":  # fault every page in now: the hot path would fault once per 4 KiB written
            for log in self._logs:
                log.zero_()
        self.reset()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def checks(self) -> bool:
        """Whether frees are checked id by id: its plan has the is_free flags."""
        return self._is_free is not None

    @property
    def available(self) -> int:
        """How many ids are free."""
        return self._tail - self._head

    @property
    def nbytes(self) -> int:
        """Device bytes held for the life of the log: its planned slots (kvcache.sizing.allocator_footprint)."""
        return slots_nbytes(self._slots)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """`{prefix}free_log.0`, `.1` (and `{prefix}is_free` when checking), the plan's names."""
        return dict(zip((t.name for s in self._slots for t in s.tensors), self._views))

    def free_ids(self) -> torch.Tensor:
        """The free ids, in the order take() would hand them out (a view)."""
        return self._log[self._head:self._tail]

    def take(self, n: int) -> torch.Tensor | None:
        """n free ids as a view kept until `capacity` more ids are freed, or None (nothing changes) when fewer are free."""
        head = self._head
        if self._is_free is None and 0 <= n <= self._tail - head:  # the hot path, inlined
            self._head = head + n
            return self._log[head:head + n]
        head = self.take_at(n)
        return None if head is None else self._log[head:head + n]

    @property
    def buffer(self) -> torch.Tensor:
        """The active log: take_at(n) == h means the ids are buffer[h:h+n] (valid as take()'s view is)."""
        return self._log

    def take_at(self, n: int) -> int | None:
        """Take n free ids and say where they start in `buffer` (a device kernel reads them), or None when fewer are free."""
        head = self._head
        if n > self._tail - head or n < 0:
            if n < 0:
                raise ValueError(f"cannot allocate a negative number of {self._unit}s ({n})")
            return None
        self._head = head + n
        if self._is_free is not None:
            self._is_free[self._log[head:head + n] // self._stride] = False
        return head

    def untake(self, head: int, n: int) -> None:
        """Give back the n ids the last take_at(n) returned `head` for (the caller failed before using them)."""
        if self._head != head + n:
            raise ValueError(f"untake({head}, {n}) is not the latest take (head is {self._head})")
        self._head = head
        if self._is_free is not None:
            self._is_free[self._log[head:head + n] // self._stride] = True

    def untake_latest(self, n: int) -> None:
        """Give back the n ids the latest take handed out (a caller whose later step failed)."""
        self.untake(self._head - n, n)

    def put(self, ids: torch.Tensor, *, multiply: int = 1) -> None:
        """Return ids * multiply (any integer dtype on this device, 1-D) to the free list: one kernel."""
        n, tail = ids.numel(), self._tail
        if 0 < n and self._is_free is None and tail + n <= self._length \
                and tail - self._head + n <= self._capacity:  # the hot path
            if multiply == 1:
                self._log[tail:tail + n] = ids
            else:
                torch.mul(ids, multiply, out=self._log[tail:tail + n])
            self._tail = tail + n
            return
        if n == 0:
            return
        if self._is_free is not None:
            self._validate(ids * multiply if multiply != 1 else ids)
        if self._tail - self._head + n > self._capacity:
            raise ValueError(
                f"freeing {n} ids ({self._unit}) but only {self._capacity - self.available} are allocated "
                "(a double free? check_frees=True names the id)"
            )
        if self._tail + n > self._length:
            self._compact()
        dest = self._log[self._tail:self._tail + n]
        if multiply == 1:
            dest.copy_(ids)
        else:
            torch.mul(ids, multiply, out=dest)
        self._tail += n
        if self._is_free is not None:
            self._is_free[dest // self._stride] = True

    def put_all(self, parts: list[torch.Tensor]) -> None:
        """put() of their concatenation (int64, this device), written straight into the log: one kernel."""
        n = sum(part.numel() for part in parts)
        tail = self._tail
        if self._is_free is None and tail + n <= self._length and tail - self._head + n <= self._capacity:
            torch.cat(parts, out=self._log[tail:tail + n])
            self._tail = tail + n
        elif n:
            self.put(torch.cat(parts))

    def _activate(self, index: int, head: int, tail: int) -> None:
        self._active, self._log, self._head, self._tail = index, self._logs[index], head, tail

    def _compact(self) -> None:
        """Copy the free ids to the front of the other log and make it active (see the module's guarantee)."""
        other = 1 - self._active
        saved = self._saved
        if saved is not None and saved.spill is None and saved.index == other:
            saved.spill = self._logs[other][saved.head:saved.tail].clone()  # rare: a backup across 2 compactions
        count = self._tail - self._head
        self._logs[other][:count].copy_(self._log[self._head:self._tail])
        self._activate(other, 0, count)

    def _validate(self, ids: torch.Tensor) -> None:
        """Raise ValueError naming the first bad id: padding 0, out of range, repeated, or already free."""
        assert self._is_free is not None
        unit, stride = self._unit, self._stride
        ids = ids.reshape(-1).to(torch.int64)
        if bool((ids == 0).any()):
            raise ValueError(f"cannot free {unit} 0: it is the padding {unit} and is never handed out")
        misaligned = ids[ids % stride != 0]
        if misaligned.numel():
            raise ValueError(f"token index {int(misaligned[0])} does not start a {unit} of {stride} tokens")
        ids = ids // stride
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

    def _reset_flags(self) -> None:
        if self._is_free is not None:
            self._is_free.zero_()
            self._is_free[self._log[self._head:self._tail] // self._stride] = True

    def reset(self) -> None:
        """Everything free again, in the fresh order; any backup becomes void."""
        if self._device.type != "meta":  # meta holds no values (and its arange costs a second of imports)
            fresh = torch.arange(1, self._capacity + 1, dtype=torch.int64, device=self._device) * self._stride
            self._log[:self._capacity].copy_(fresh)
        self._head, self._tail = 0, self._capacity
        self._saved = None
        self._reset_flags()
        self._backups.advance()

    @property
    def built_capacity(self) -> int:
        """The capacity the buffers were built for (shrink() goes no higher)."""
        return self._length // LOG_LENGTH_FACTOR

    def shrink(self, capacity: int) -> None:
        """Ids 1..capacity from now on, all free (a post-capture resize); the buffers stay as built."""
        built = self.built_capacity
        if not 1 <= capacity <= built:
            raise ValueError(f"a free list built for {built} ids ({self._unit}) cannot be resized to {capacity}")
        self._capacity = capacity
        self.reset()

    def backup(self) -> FreeLogState:
        """O(1); voids any earlier backup."""
        generation = self._backups.advance()
        self._saved = _Saved(self._active, self._head, self._tail)
        return FreeLogState(owner=self._backups.owner, generation=generation)

    def restore(self, state: FreeLogState) -> None:
        """Make the free set what it was at `state`: O(1) (O(capacity) with check=True)."""
        self._backups.check(state)
        saved = self._saved
        assert saved is not None
        if saved.spill is not None:  # its log was rewritten: the copy goes to the front of the inactive log
            count = saved.spill.numel()
            self._logs[1 - self._active][:count].copy_(saved.spill)
            self._saved = saved = _Saved(1 - self._active, 0, count)
        self._activate(saved.index, saved.head, saved.tail)
        self._reset_flags()
