"""FreeListAllocator: what the token and paged allocators share (SGLang 0.5.23's free API, groups, backup).

Both keep one FreeLog of ids (token indices, or page starts) and differ only in how a
freed token set becomes ids; subclasses say that through `_set_ids` and `_segment_ids`.
Meta-device allocators construct, report sizes and back up, but refuse to hand out
or take back indices: a meta tensor has no values, so any index it "held" would be
a lie. A dry run goes through construction (and its byte count) and nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.allocators.eviction import evict_shortfall
from kvcache.allocators.free_group import FreeGroup, FreeGroupState
from kvcache.allocators.free_log import FreeLog, FreeLogState
from kvcache.allocators.given import as_indices, checked_page_size, page_disjoint, reject_meta
from kvcache.allocators.scheduler_hooks import SchedulerCapacityHooks
from kvcache.pools.planned_views import Views
from kvcache.sizing.tensor_plan import PlannedSlot


@dataclass(frozen=True, slots=True)
class AllocatorState:
    """An opaque backup of a token or paged allocator: its free list and its free group."""

    free_list: FreeLogState
    free_group: FreeGroupState


class SharedAllocatorAPI(SchedulerCapacityHooks):
    """What the token, paged and SWA allocators share of SGLang 0.5.23's base: free_segments /
    free_full_segments over free_segment / free_full_segment, get_extend_allocation_demand, and the
    scheduler's capacity hooks (kvcache.allocators.scheduler_hooks)."""

    page_size: int

    def get_extend_allocation_demand(
        self, prefix_lens_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor, *, conservative_num_tokens: int,
        shard_size: int = 1,
    ) -> int:
        """Tokens to make room for before a paged extend (SGLang 0.5.23: the caller's conservative bound)."""
        return conservative_num_tokens

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        raise NotImplementedError

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        raise NotImplementedError

    def free_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        """Free several page-disjoint (kv indices, start position) segments of one request's row."""
        for free_index, start_pos in page_disjoint(segments, self.page_size):
            self.free_segment(free_index, start_pos=start_pos)

    def free_full_segments(self, segments: Iterable[tuple[torch.Tensor, int]]) -> None:
        for free_index, start_pos in page_disjoint(segments, self.page_size):
            self.free_full_segment(free_index, start_pos=start_pos)


class FreeListAllocator(SharedAllocatorAPI):
    """SGLang's allocator API over one FreeLog of ids, each id standing for page_size tokens. `slots` are its free
    list's part of the plan (kvcache.sizing.allocator_footprint.free_list_slots): its size, and whether it checks
    frees (the is_free flags planned), are read from them."""

    def __init__(
        self, *, slots: Sequence[PlannedSlot], page_size: int, device: torch.device | str, unit: str,
        kvcache: Any = None, views: Views | None = None,
    ) -> None:
        self._device = torch.device(device)
        self._page_size = checked_page_size(page_size)
        self._log = FreeLog(slots=slots, device=self._device, unit=unit, stride=page_size, views=views)
        self._checking = self._log.checks
        self._group = FreeGroup()
        self._kvcache = kvcache
        # The hot paths take flat int64 tensors on this device as they are; -2 (no tensor's get_device())
        # turns them off where every call must be checked (check_frees) or refused (meta).
        self._hot_device = -2 if self._checking or self._device.type == "meta" else torch.empty(
            0, device=self._device).get_device()

    def is_hot(self, indices: torch.Tensor) -> bool:
        """Whether indices may skip the general path's checks and conversions (outside a free group)."""
        return (indices.dtype is torch.int64 and indices.ndim == 1 and indices.get_device() == self._hot_device
                and not self._group.is_open)

    @property
    def size(self) -> int:
        """Usable tokens (the pool has page_size more rows: the padding page)."""
        return self._log.capacity * self._page_size

    @property
    def size_full(self) -> int:
        return self.size

    @property
    def check_frees(self) -> bool:
        """Whether every free is checked id by id (a double free is named): its plan has the is_free flags. A
        resize's fresh allocator is asked for the same, or double frees after it would pass unseen."""
        return self._checking

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def nbytes(self) -> int:
        """Device bytes of the index buffers (kvcache.sizing.allocator_footprint states the formula)."""
        return self._log.nbytes

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The free list's device buffers by the plan's names (kvcache.sizing.allocator_footprint)."""
        return self._log.named_tensors()

    def get_kvcache(self) -> Any:
        """The KV pool these indices address (None when built without one)."""
        return self._kvcache

    def attach_kvcache(self, kvcache: Any) -> None:
        """Name the KV pool these indices address, for a pool built after the allocator."""
        self._kvcache = kvcache

    def available_size(self) -> int:
        """Free tokens."""
        return self._log.available * self._page_size

    def full_available_size(self) -> int:
        return self.available_size()

    def get_all_free_pages(self) -> torch.Tensor:
        """The free page ids (token indices at page size 1), for censuses and debugging (SGLang 0.5.23's name)."""
        return self._log.free_ids() // self._page_size

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> None:
        """Ask tree_cache to evict until num_tokens could be allocated (nothing when they already can)."""
        evict_shortfall(tree_cache, full_shortfall=num_tokens - self.available_size())

    def untake_latest(self, need_size: int) -> None:
        """Put back the need_size tokens this allocator's latest alloc handed out, as if never taken (that alloc
        must be the latest change to the free list: the SWA allocator's rollback when its other side fails)."""
        self._log.untake_latest(need_size // self._page_size)

    def free(self, free_index: torch.Tensor) -> None:
        """Give back token indices (a set: a paged pool frees every page they touch, once)."""
        if free_index.numel() == 0:
            return
        reject_meta(self._device, "free")
        indices = as_indices(free_index, self._device, "free_index")
        if self._group.is_open:
            ids, dedup = self._set_ids(indices)
            self._group.defer((ids.to(torch.int64, copy=True), dedup))
        elif self._page_size == 1:  # the hot path: token indices are ids, appended as they are
            self._log.put(indices)
        else:
            self._release([self._set_ids(indices)])

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free kv_row[start_pos : start_pos + n] of one request: start_pos is page-aligned, the last page may be partial."""
        if self.is_hot(free_index) and start_pos % self._page_size == 0:
            if free_index.shape[0]:
                self._log.put(free_index[:: self._page_size])  # every page_size-th index starts a page
            return
        if free_index.numel() == 0:
            return
        reject_meta(self._device, "free_segment")
        if start_pos % self._page_size:
            raise ValueError(f"segment start {start_pos} is not a multiple of page_size {self._page_size}")
        self.free_page_starts(self._segment_ids(as_indices(free_index, self._device, "free_index")))

    def free_page_starts(self, starts: torch.Tensor) -> None:
        """Free whole pages named by their first token index (a free_segment whose every page_size-th index is given)."""
        if starts.numel() == 0:
            return
        reject_meta(self._device, "free_page_starts")
        self._put_starts(starts)

    def _put_starts(self, ids: torch.Tensor, *, multiply: int = 1) -> None:
        """Free the distinct page starts ids * multiply: appended in one kernel, or a copy deferred in a free group."""
        if self._group.is_open:
            self._group.defer((ids * multiply if multiply != 1 else ids.to(torch.int64, copy=True), False))
        else:
            self._log.put(ids, multiply=multiply)

    def free_full(self, free_index: torch.Tensor) -> None:
        """free() (a single pool has no sliding-window peer)."""
        self.free(free_index)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        self.free_segment(free_index, start_pos=start_pos)

    def _set_ids(self, indices: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The ids a token set frees, and whether they may repeat (then released with torch.unique)."""
        raise NotImplementedError

    def _segment_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """The ids of a page-aligned row segment: one per page, no repeats."""
        raise NotImplementedError

    def _release(self, items: list[tuple[torch.Tensor, bool]]) -> None:
        exact = [ids for ids, dedup in items if not dedup]
        repeats = [ids for ids, dedup in items if dedup]
        if repeats:  # data-dependent length: one host sync, as in SGLang's paged free
            exact.append(torch.unique(repeats[0] if len(repeats) == 1 else torch.cat(repeats)))
        if exact:
            self._log.put_all(exact)

    def free_group_begin(self) -> None:
        self._group.begin()

    def free_group_end(self) -> None:
        items = self._group.end()
        if items:
            self._release(items)

    def clear(self) -> None:
        """Everything free again and any free group closed; earlier backups and handed-out indices become void."""
        self._group.close()
        self._log.reset()

    def resize(self, config: Any) -> None:
        """SGLang 0.5.23's post-capture resize: config.max_total_num_tokens usable tokens (at most as built), all
        free again, like clear()."""
        self.resize_tokens(int(config.max_total_num_tokens))

    def check_resize(self, tokens: int) -> None:
        """Raise ValueError (changing nothing) unless tokens is a multiple of page_size within the size as built."""
        if tokens % self._page_size:
            raise ValueError(f"resize to {tokens} tokens: not a multiple of page_size {self._page_size}")
        built = self._log.built_capacity * self._page_size
        if not self._page_size <= tokens <= built:
            raise ValueError(f"an allocator built for {built} tokens cannot be resized to {tokens}")

    def resize_tokens(self, tokens: int) -> None:
        """tokens usable tokens from now on, all free, any free group closed; a refused size changes nothing."""
        self.check_resize(tokens)
        self._group.close()
        self._log.shrink(tokens // self._page_size)

    def backup_allocator_state(self) -> AllocatorState:
        """O(1). Only the latest backup can be restored. (SGLang 0.5 dropped backup_state; ours keeps it under this name.)"""
        return AllocatorState(free_list=self._log.backup(), free_group=self._group.mark())

    def restore_allocator_state(self, state: AllocatorState) -> None:
        """Free set and free group as at backup, in O(1); indices handed out since are void."""
        self._log.restore(state.free_list)
        self._group.restore(state.free_group)

    backup_state = backup_allocator_state
    restore_state = restore_allocator_state
