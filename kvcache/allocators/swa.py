"""SWATokenToKVPoolAllocator: a full-pool allocator paired with a smaller sliding-window (SWA) one.

Callers hold full-pool indices. Every token handed out also gets an SWA row, and
`full_to_swa_index_mapping` (one int64 row per full-pool row, 0 = unmapped, and a
last row of -1) says which; the SWA KV pool translates through it. free_swa /
free_swa_segment release the SWA rows of tokens that left the window, so the SWA pool
need only hold the live windows; free_full / free_full_segment then release the rest.

With page_size > 1 both sides are paged with the same page size and a full page maps
onto one SWA page offset for offset (both sides take fresh pages together, planned
once on the host), so frees work on whole pages. Segment frees (what SGLang 0.5.23's
radix cache calls) run without a host sync; set frees (free, free_swa) sync once (the frees:
kvcache.allocators.swa_frees).
Backup covers both sides, the free group and the map (journaled while live).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.allocators.base import AllocatorState, SharedAllocatorAPI
from kvcache.allocators.given import (
    as_indices, check_need_size, checked_page_size, planned_swa_sides, reject_meta)
from kvcache.allocators.eviction import evict_shortfall
from kvcache.allocators.free_group import FreeGroup, FreeGroupState
from kvcache.allocators.index_map import FullToSWAMap, IndexMapState
from kvcache.allocators.locations import decode_starts_page, host_lengths
from kvcache.allocators.paged import PagedTokenToKVPoolAllocator
from kvcache.allocators.scheduler_hooks import SWACapacityHooks
from kvcache.allocators.swa_frees import SWAFrees
from kvcache.allocators.token import TokenToKVPoolAllocator
from kvcache.allocators.backups import BackupState, LatestBackup
from kvcache.errors import PlanMismatchError
from kvcache.pools.planned_views import Views
from kvcache.sizing.tensor_plan import PlannedSlot


SideAllocator = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator


@dataclass(frozen=True, slots=True)
class SWAAllocatorState(BackupState):
    """An opaque backup of both sides, the index map and the free group."""

    full: AllocatorState
    swa: AllocatorState
    index_map: IndexMapState
    free_group: FreeGroupState


def _side(slots: Sequence[PlannedSlot], page_size: int, device: torch.device, views: Views | None) -> SideAllocator:
    if page_size == 1:
        return TokenToKVPoolAllocator(slots=slots, device=device, views=views)
    return PagedTokenToKVPoolAllocator(slots=slots, page_size=page_size, device=device, views=views)


class SWATokenToKVPoolAllocator(SWAFrees, SWACapacityHooks, SharedAllocatorAPI):
    """Full and SWA allocators behind SGLang 0.5.23's allocator API; hands out full-pool indices. `slots` are its
    part of the plan (kvcache.sizing.allocator_footprint.allocator_slots: both sides' free lists and the map), which
    say both sides' sizes and whether they check frees; the map must have a row per full-pool row (tokens and the
    padding page) and the -1 row. Its buffers are their views in `views` (the builder's carve), or, given None, its
    own."""

    def __init__(
        self, *, slots: Sequence[PlannedSlot], page_size: int, device: torch.device | str, kvcache: Any = None,
        views: Views | None = None,
    ) -> None:
        full, swa, table = planned_swa_sides(slots)
        self._device = torch.device(device)
        self._page_size = checked_page_size(page_size)
        self._kvcache: Any = None
        self.full_attn_allocator = _side(full, page_size, self._device, views)
        self.swa_attn_allocator = _side(swa, page_size, self._device, views)
        self._check = self.full_attn_allocator.check_frees
        if self.swa_attn_allocator.check_frees != self._check:
            raise PlanMismatchError("an SWA allocator's two free lists are planned with and without is_free flags: "
                                    "both sides check frees or neither does")
        rows = self.full_attn_allocator.size + page_size + 1  # every full-pool row and the -1 row
        if [t.shape for t in table.tensors] != [(rows,)]:
            raise PlanMismatchError(f"the full -> SWA map is planned as {[t.shape for t in table.tensors]}; the full side's "
                                    f"{self.full_attn_allocator.size} tokens in pages of {page_size} need ({rows},)")
        self._map = FullToSWAMap(slot=table, device=self._device, views=views)
        self._group = FreeGroup()
        self._backups = LatestBackup()
        if kvcache is not None:
            self.attach_kvcache(kvcache)

    @property
    def size(self) -> int:
        """Tokens both sides can hold at once (SGLang 0.5.23: min of the two sizes)."""
        return min(self.full_attn_allocator.size, self.swa_attn_allocator.size)

    @property
    def size_full(self) -> int:
        return self.full_attn_allocator.size

    @property
    def check_frees(self) -> bool:
        """Whether both sides check every free id by id, as built."""
        return self._check

    @property
    def size_swa(self) -> int:
        return self.swa_attn_allocator.size

    full_size = size_full
    swa_size = size_swa

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def full_to_swa_index_mapping(self) -> torch.Tensor:
        """int64, length full_size + page_size + 1: the SWA index of each full index (0 = unmapped; last row -1)."""
        return self._map.table

    @property
    def nbytes(self) -> int:
        """Device bytes of both free lists and the map (kvcache.sizing.allocator_footprint states the formula)."""
        return self.full_attn_allocator.nbytes + self.swa_attn_allocator.nbytes + self._map.nbytes

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Both sides' free lists and the map, by the plan's names (kvcache.sizing.allocator_footprint)."""
        return {**self.full_attn_allocator.named_tensors(), **self.swa_attn_allocator.named_tensors(),
                **self._map.named_tensors()}

    def get_kvcache(self) -> Any:
        return self._kvcache

    def attach_kvcache(self, kvcache: Any) -> None:
        """Name the hybrid KV pool (its full and SWA sides go to the side allocators) and register the map
        with it: the pool builder builds the hybrid pool after this allocator, since the pool needs the map."""
        self._kvcache = kvcache
        self.full_attn_allocator.attach_kvcache(getattr(kvcache, "full_kv_pool", None))
        self.swa_attn_allocator.attach_kvcache(getattr(kvcache, "swa_kv_pool", None))
        if hasattr(kvcache, "register_mapping"):
            kvcache.register_mapping(self._map.table)

    def available_size(self) -> int:
        """Tokens that can be handed out now: both sides must have room."""
        return min(self.full_attn_allocator.available_size(), self.swa_attn_allocator.available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> None:
        """Ask tree_cache for each side's shortfall in one evict_for_alloc call."""
        evict_shortfall(tree_cache, full_shortfall=num_tokens - self.full_available_size(),
                        swa_shortfall=num_tokens - self.swa_available_size())

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """The SWA index of each full index (0 where unmapped, -1 for -1)."""
        return self._map.lookup(as_indices(kv_indices, self._device, "kv_indices").view(kv_indices.shape))

    def set_full_to_swa_mapping(self, full_indices: torch.Tensor, swa_indices: torch.Tensor) -> None:
        if full_indices.numel():
            self._map.write(as_indices(full_indices, self._device, "full_indices"), swa_indices.reshape(-1))

    def clear_full_to_swa_mapping(self, full_indices: torch.Tensor) -> None:
        if full_indices.numel():
            self._map.write(as_indices(full_indices, self._device, "full_indices"), 0)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size full indices, each mapped to a fresh SWA slot; None (allocating nothing) if either side lacks room."""
        check_need_size(need_size, self._page_size)
        reject_meta(self._device, "alloc")
        if need_size > self.available_size():
            return None
        return self._take_both(need_size, lambda side: side.alloc(need_size))

    def _take_both(self, tokens: int, take: Callable[[SideAllocator], torch.Tensor | None]) -> torch.Tensor:
        """take() on the full side, then the SWA side, then map them: all or nothing (room was checked). If the
        second take or the map write raises (a device OOM), the tokens taken go back, so the free lists are
        unchanged."""
        full = take(self.full_attn_allocator)
        assert full is not None
        swa = None
        try:
            swa = take(self.swa_attn_allocator)
            assert swa is not None
            self._map.write(full, swa)
        except BaseException:
            if swa is not None:
                self.swa_attn_allocator.untake_latest(tokens)
            self.full_attn_allocator.untake_latest(tokens)
            raise
        return full

    def _paged_sides(self, op: str) -> tuple[PagedTokenToKVPoolAllocator, PagedTokenToKVPoolAllocator]:
        reject_meta(self._device, op)
        full, swa = self.full_attn_allocator, self.swa_attn_allocator
        if not isinstance(full, PagedTokenToKVPoolAllocator) or not isinstance(swa, PagedTokenToKVPoolAllocator):
            raise ValueError(f"{op}() needs page_size > 1; with page_size 1 use alloc(n)")
        return full, swa

    def _check_still_mapped(self, last: torch.Tensor, swa_last: torch.Tensor, continues: torch.Tensor) -> None:
        """check_frees only (it syncs): every request that continues a page (CPU mask) must still have its SWA slot."""
        lost = continues.to(self._device) & (swa_last == 0)
        if bool(lost.any()):
            raise ValueError(
                f"full index {int(last[lost][0])} continues a partial page but has no SWA slot "
                "(its page left the window through free_swa while still being written)"
            )

    def alloc_extend(
        self, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor, seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Paged extend on both sides (one host plan, same page count); the full indices, or None allocating nothing."""
        full_side, swa_side = self._paged_sides("alloc_extend")
        plan, last = full_side._count_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                                             extend_num_tokens)
        if plan.num_new_pages * self._page_size > self.available_size():
            return None
        swa_last = self._map.lookup(last)
        if self._check:
            prefix = prefix_lens_cpu.reshape(-1).cpu()
            continues = (prefix % self._page_size != 0) & (seq_lens_cpu.reshape(-1).cpu() > prefix)
            self._check_still_mapped(last, swa_last, continues)
        return self._take_both(plan.num_new_pages * self._page_size,
                               lambda side: side._extend_with(plan, swa_last if side is swa_side else last))

    def alloc_decode(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """Paged decode on both sides; the full indices, or None allocating nothing."""
        full_side, swa_side = self._paged_sides("alloc_decode")
        batch, last = full_side._count_decode(seq_lens, seq_lens_cpu, last_loc)
        if batch.num_new_pages * self._page_size > self.available_size():
            return None
        swa_last = self._map.lookup(last)
        if self._check:
            continues = ~decode_starts_page(host_lengths(seq_lens_cpu, "seq_lens_cpu"), self._page_size)
            self._check_still_mapped(last, swa_last, continues)
        return self._take_both(batch.num_new_pages * self._page_size,
                               lambda side: side._decode_with(batch, swa_last if side is swa_side else last))

    def free_group_begin(self) -> None:
        self._group.begin()
        self.full_attn_allocator.free_group_begin()
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self._group.end()
        self.full_attn_allocator.free_group_end()
        self.swa_attn_allocator.free_group_end()

    def clear(self) -> None:
        """Both sides free, the map empty, any free group closed; earlier backups become void."""
        self._group.close()
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self._map.reset()
        self._backups.advance()

    def resize(self, config: Any) -> None:
        """SGLang 0.5.23's post-capture resize: config.full_max_total_num_tokens / swa_max_total_num_tokens
        (each at most as built), everything free again, like clear(); a size either side refuses changes nothing."""
        full, swa = int(config.full_max_total_num_tokens), int(config.swa_max_total_num_tokens)
        self.full_attn_allocator.check_resize(full)
        self.swa_attn_allocator.check_resize(swa)
        self.full_attn_allocator.resize_tokens(full)
        self.swa_attn_allocator.resize_tokens(swa)
        self.clear()

    def backup_allocator_state(self) -> SWAAllocatorState:
        """O(1). Only the latest backup can be restored (SGLang 0.5 has no backup; the name is ours)."""
        generation = self._backups.advance()
        return SWAAllocatorState(
            owner=self._backups.owner, generation=generation, full=self.full_attn_allocator.backup_allocator_state(),
            swa=self.swa_attn_allocator.backup_allocator_state(), index_map=self._map.mark(),
            free_group=self._group.mark(),
        )

    def restore_allocator_state(self, state: SWAAllocatorState) -> None:
        """Both free sets, the map and the free group as at backup; costs what changed since."""
        self._backups.check(state)
        self.full_attn_allocator.restore_allocator_state(state.full)
        self.swa_attn_allocator.restore_allocator_state(state.swa)
        self._map.restore(state.index_map)
        self._group.restore(state.free_group)

    backup_state = backup_allocator_state
    restore_state = restore_allocator_state
