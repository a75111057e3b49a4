"""SWATokenToKVPoolAllocator: a full-pool allocator paired with a smaller sliding-window (SWA) one.

Callers hold full-pool indices. Every token handed out also gets an SWA row, and
`full_to_swa_index_mapping` (one int64 row per full-pool row, 0 = unmapped) says
which; the SWA KV pool translates through it. free_swa releases the SWA rows of
tokens that left the window, so the SWA pool need only hold the live windows.

With page_size > 1 both sides are paged with the same page size and a full page maps
onto one SWA page offset for offset (both sides take fresh pages together), so frees
work on whole pages: free and free_swa unmap every row of the pages they touch.
Backup covers both sides, the free group and the map (journaled while live), so a
restore leaves the map consistent with the restored free sets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvcache.allocators.base import AllocatorState, as_indices, check_need_size, reject_meta
from kvcache.allocators.free_group import FreeGroup, FreeGroupState
from kvcache.allocators.index_map import FullToSWAMap, IndexMapState
from kvcache.allocators.locations import decode_starts_page
from kvcache.allocators.paged import PagedTokenToKVPoolAllocator
from kvcache.allocators.token import TokenToKVPoolAllocator

_serials = itertools.count(1)

SideAllocator = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator


@dataclass(frozen=True, slots=True)
class SWAAllocatorState:
    """An opaque backup of both sides, the index map and the free group."""

    owner: int
    generation: int
    full: AllocatorState
    swa: AllocatorState
    index_map: IndexMapState
    free_group: FreeGroupState


def _side(name: str, size: int, page_size: int, device: torch.device, check: bool) -> SideAllocator:
    if size < page_size or size % page_size:
        raise ValueError(f"{name} {size} must be a positive multiple of page_size {page_size}")
    if page_size == 1:
        return TokenToKVPoolAllocator(size=size, device=device, check_frees=check)
    return PagedTokenToKVPoolAllocator(size=size, page_size=page_size, device=device, check_frees=check)


class SWATokenToKVPoolAllocator:
    """Full and SWA allocators behind SGLang's allocator API; hands out full-pool indices."""

    def __init__(
        self, *, full_size: int, swa_size: int, page_size: int, device: torch.device | str, check_frees: bool = False,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._device = torch.device(device)
        self._page_size = page_size
        self._check = check_frees
        self._full = _side("full_size", full_size, page_size, self._device, check_frees)
        self._swa = _side("swa_size", swa_size, page_size, self._device, check_frees)
        self._map = FullToSWAMap(rows=full_size + page_size, device=self._device)
        self._group = FreeGroup()
        self._serial = next(_serials)
        self._generation = 0

    @property
    def size(self) -> int:
        """Usable full-pool tokens (SGLang's `size` of this allocator)."""
        return self._full.size

    @property
    def full_size(self) -> int:
        return self._full.size

    @property
    def swa_size(self) -> int:
        return self._swa.size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def full_to_swa_index_mapping(self) -> torch.Tensor:
        """int64, length full_size + page_size: the SWA index of each full index (0 = unmapped)."""
        return self._map.table

    @property
    def nbytes(self) -> int:
        """Device bytes of both free lists and the map (kvcache.allocators.footprint states the formula)."""
        return self._full.nbytes + self._swa.nbytes + self._map.nbytes

    def available_size(self) -> int:
        """Tokens that can be handed out now: both sides must have room."""
        return min(self._full.available_size(), self._swa.available_size())

    def full_available_size(self) -> int:
        return self._full.available_size()

    def swa_available_size(self) -> int:
        return self._swa.available_size()

    def translate_loc_from_full_to_swa(self, full_indices: torch.Tensor) -> torch.Tensor:
        """The SWA index of each full index (0 where unmapped)."""
        return self._map.lookup(as_indices(full_indices, self._device, "full_indices").view(full_indices.shape))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size full indices, each mapped to a fresh SWA slot; None (allocating nothing) if either side lacks room."""
        check_need_size(need_size, self._page_size)
        reject_meta(self._device, "alloc")
        if need_size > self.available_size():
            return None
        full, swa = self._full.alloc(need_size), self._swa.alloc(need_size)
        assert full is not None and swa is not None
        self._map.write(full, swa)
        return full

    def _paged_sides(self, op: str) -> tuple[PagedTokenToKVPoolAllocator, PagedTokenToKVPoolAllocator]:
        reject_meta(self._device, op)
        if not isinstance(self._full, PagedTokenToKVPoolAllocator) or not isinstance(self._swa, PagedTokenToKVPoolAllocator):
            raise ValueError(f"{op}() needs page_size > 1; with page_size 1 use alloc(n)")
        return self._full, self._swa

    def _swa_last_loc(self, last_loc: torch.Tensor, continues: Callable[[], torch.Tensor]) -> torch.Tensor:
        """last_loc in SWA space (entries of requests that start a page are ignored downstream).

        With check_frees, `continues()` says which requests continue a page, and each of
        those must still have its SWA slot.
        """
        last = as_indices(last_loc, self._device, "last_loc")
        swa_last = self._map.lookup(last.clamp(0, self._map.table.numel() - 1))
        if self._check:
            lost = continues() & (swa_last == 0)
            if bool(lost.any()):
                raise ValueError(
                    f"full index {int(last[lost][0])} continues a partial page but has no SWA slot "
                    "(its page left the window through free_swa while still being written)"
                )
        return swa_last

    def alloc_extend(
        self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Paged extend on both sides (same page count); returns the full indices, or None allocating nothing."""
        full_side, swa_side = self._paged_sides("alloc_extend")
        pages = full_side.extend_pages_needed(prefix_lens, seq_lens, extend_num_tokens)
        if pages * self._page_size > self.available_size():
            return None
        prefix = as_indices(prefix_lens, self._device, "prefix_lens")
        swa_last = self._swa_last_loc(last_loc, lambda: prefix % self._page_size != 0)
        full = full_side.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages=pages)
        swa = swa_side.alloc_extend(prefix_lens, seq_lens, swa_last, extend_num_tokens, num_new_pages=pages)
        assert full is not None and swa is not None
        self._map.write(full, swa)
        return full

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """Paged decode on both sides; returns the full indices, or None allocating nothing."""
        full_side, swa_side = self._paged_sides("alloc_decode")
        pages = full_side.decode_pages_needed(seq_lens)
        if pages * self._page_size > self.available_size():
            return None
        seq = as_indices(seq_lens, self._device, "seq_lens")
        swa_last = self._swa_last_loc(last_loc, lambda: ~decode_starts_page(seq, self._page_size))
        full = full_side.alloc_decode(seq_lens, last_loc, num_new_pages=pages)
        swa = swa_side.alloc_decode(seq_lens, swa_last, num_new_pages=pages)
        assert full is not None and swa is not None
        self._map.write(full, swa)
        return full

    def _rows_of(self, full: torch.Tensor) -> torch.Tensor:
        """Every map row of the pages these full indices belong to, once each (the indices at page_size 1)."""
        if self._page_size == 1:
            return torch.unique(full)
        offsets = torch.arange(self._page_size, dtype=torch.int64, device=self._device)
        pages = torch.unique(full // self._page_size)
        return (pages[:, None] * self._page_size + offsets).reshape(-1)

    def free_swa(self, full_indices: torch.Tensor) -> None:
        """Release only the SWA slots of these tokens (they left the window); the full side stays held."""
        if full_indices.numel() == 0:
            return
        reject_meta(self._device, "free_swa")
        rows = self._rows_of(as_indices(full_indices, self._device, "full_indices"))
        swa = self._map.lookup(rows)
        held = swa[swa > 0]
        if held.numel():
            self._swa.free(held)
            self._map.write(rows, 0)

    def free(self, free_index: torch.Tensor) -> None:
        """Release both sides of these full indices; inside a free group, at free_group_end()."""
        if free_index.numel() == 0:
            return
        reject_meta(self._device, "free")
        full = as_indices(free_index, self._device, "free_index")
        if not self._group.defer(full):
            self._release(full)

    def _release(self, full: torch.Tensor) -> None:
        rows = self._rows_of(full)
        swa = self._map.lookup(rows)
        held = swa[swa > 0]
        self._full.free(full)  # with check_frees this raises before anything changed
        if held.numel():
            self._swa.free(held)
        self._map.write(rows, 0)

    def free_group_begin(self) -> None:
        self._group.begin()

    def free_group_end(self) -> None:
        full = self._group.end()
        if full is not None:
            self._release(full)

    def clear(self) -> None:
        """Both sides free, the map empty, any free group closed; earlier backups become void."""
        self._group.close()
        self._full.clear()
        self._swa.clear()
        self._map.reset()
        self._generation += 1

    def backup_state(self) -> SWAAllocatorState:
        """O(1). Only the latest backup can be restored."""
        self._generation += 1
        return SWAAllocatorState(
            owner=self._serial, generation=self._generation, full=self._full.backup_state(),
            swa=self._swa.backup_state(), index_map=self._map.mark(), free_group=self._group.mark(),
        )

    def restore_state(self, state: SWAAllocatorState) -> None:
        """Both free sets, the map and the free group as at backup; costs what changed since."""
        if state.owner != self._serial or state.generation != self._generation:
            raise ValueError(
                f"allocator state (backup #{state.generation}) is not the latest backup of this allocator "
                f"(latest is #{self._generation}; a newer backup_state() or a clear() replaced it)"
            )
        self._full.restore_state(state.full)
        self._swa.restore_state(state.swa)
        self._map.restore(state.index_map)
        self._group.restore(state.free_group)
