"""FullToSWAMap: the int64 table from full-pool token index to SWA-pool token index (0 = unmapped).

As in SGLang 0.5.23 the table has one more row, holding -1, so a last_loc of -1 (no
prefix) translates to -1 on the SWA side too.

Between a backup and its restore, every write first journals the old values of the
rows it touches (O(n) per write), and restore replays the journal backwards: its cost
is what changed since the backup. If the journal grows past the table's length (a
backup left live a long time), it is folded once into a snapshot of the table as it
was at the backup (O(table), paid for by at least as many journaled writes) and
writes stop journaling; restore then copies the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache.allocators.backups import BackupState, LatestBackup
from kvcache.errors import PlanMismatchError
from kvcache.pools.planned_views import Views, slots_nbytes, take_views
from kvcache.sizing.allocator_footprint import full_to_swa_slot
from kvcache.sizing.tensor_plan import PlannedSlot



@dataclass(frozen=True, slots=True)
class IndexMapState(BackupState):
    """An opaque backup: which map, which backup generation."""


def page_starts_of(full: torch.Tensor, page_size: int) -> torch.Tensor:
    """The first full index of every page these full indices touch, once each (torch.unique: a host sync)."""
    return torch.unique(full if page_size == 1 else full - full % page_size)


def page_rows(starts: torch.Tensor, page_size: int) -> torch.Tensor:
    """Every row of the pages starting at these full indices, page by page."""
    if page_size == 1:
        return starts
    offsets = torch.arange(page_size, dtype=torch.int64, device=starts.device)
    return torch.add(offsets, starts[:, None]).reshape(-1)


class FullToSWAMap:
    """One row per full-pool row (tokens plus the padding page) and the -1 row; rows of free tokens read 0.
    `slot` is its planned slot (kvcache.sizing.allocator_footprint.full_to_swa_slot), which says its rows; the
    table is the view of its tensor in `views` (the plan's), or, given None, its own."""

    def __init__(self, *, slot: PlannedSlot, device: torch.device, views: Views | None = None) -> None:
        table = slot.tensors[0] if len(slot.tensors) == 1 else None
        planned = full_to_swa_slot(table.shape[0] - 1).tensors[0] if table is not None and table.shape else None
        if table is None or planned is None or (table.shape, table.dtype) != (planned.shape, planned.dtype) \
                or table.shape[0] < 2:
            raise PlanMismatchError(f"the full -> SWA map is planned as one int64 table of the full rows and the -1 "
                                    f"row; given {', '.join(f'{t.name} {t.shape} {t.dtype}' for t in slot.tensors)}")
        self._slot = slot
        (self._table,) = take_views([self._slot], views, device)
        self._table[-1] = -1
        self._backups = LatestBackup("index map state", "", "")
        self._journal: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._journaled = 0
        self._snapshot: torch.Tensor | None = None

    @property
    def table(self) -> torch.Tensor:
        return self._table

    @property
    def nbytes(self) -> int:
        """Its planned slot (kvcache.sizing.allocator_footprint.full_to_swa_slot)."""
        return slots_nbytes([self._slot])

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {t.name: self._table for t in self._slot.tensors}

    def lookup(self, full_indices: torch.Tensor) -> torch.Tensor:
        return self._table[full_indices]

    def held_swa_pages(self, starts: torch.Tensor, page_size: int, *, check: bool) -> torch.Tensor:
        """The SWA page of each full page (by its first row) that still has one: a paged full page maps onto one
        SWA page offset for offset, so its first row names it. Picking them is data-dependent: a host sync.
        check=True (another sync) verifies that every row of each page agrees."""
        swa = self.lookup(starts)
        if check and page_size > 1:
            rows = self.lookup(page_rows(starts, page_size)).view(-1, page_size)
            expected = swa[:, None] + torch.arange(page_size, dtype=torch.int64, device=swa.device)
            if not bool(((rows == 0) | (rows == expected)).all()):
                raise ValueError("a full page maps onto more than one SWA page (set_full_to_swa_mapping broke paging)")
        return swa[swa > 0]

    def write(self, full_indices: torch.Tensor, values: torch.Tensor | int) -> None:
        """table[full_indices] = values, journaled while a backup is live."""
        if full_indices.dtype != torch.int64:
            full_indices = full_indices.long()
        if self._journal is not None and self._snapshot is None:
            self._journal.append((full_indices.clone(), self._table[full_indices]))
            self._journaled += full_indices.numel()
            if self._journaled > self._table.numel():
                self._fold_journal()
        if isinstance(values, int):
            self._table.index_fill_(0, full_indices, values)  # a scalar kernel argument: no host-to-device copy
        else:
            self._table[full_indices] = values

    def _fold_journal(self) -> None:
        assert self._journal is not None
        snapshot = self._table.clone()
        for rows, old in reversed(self._journal):
            snapshot[rows] = old
        self._snapshot, self._journal, self._journaled = snapshot, [], 0

    def mark(self) -> IndexMapState:
        """O(1): start journaling; voids any earlier backup."""
        generation = self._backups.advance()
        self._journal, self._journaled, self._snapshot = [], 0, None
        return IndexMapState(owner=self._backups.owner, generation=generation)

    def restore(self, state: IndexMapState) -> None:
        self._backups.check(state, restorable=self._journal is not None)
        if self._snapshot is not None:
            self._table.copy_(self._snapshot)
        else:
            for rows, old in reversed(self._journal):
                self._table[rows] = old
        self._journal, self._journaled, self._snapshot = [], 0, None

    def reset(self) -> None:
        """All rows unmapped; any backup becomes void."""
        self._table[:-1].zero_()
        self._backups.advance()
        self._journal, self._journaled, self._snapshot = None, 0, None
