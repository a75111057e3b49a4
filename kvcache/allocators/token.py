"""TokenToKVPoolAllocator: KV token indices 1..size, one token at a time (page_size 1).

Index 0 is the KV pool's padding row and is never handed out. alloc() returns a view
of the free log (no kernel) and free() appends (one kernel): see
kvcache.allocators.free_log. Frees are sets of token indices, segments of a request's
row (free_segment) or "page ids" (free_page_ids), which at page size 1 are all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvcache.allocators.base import FreeListAllocator
from kvcache.allocators.given import check_need_size, reject_meta
from kvcache.pools.planned_views import Views
from kvcache.sizing.tensor_plan import PlannedSlot


class TokenToKVPoolAllocator(FreeListAllocator):
    """SGLang 0.5.23's token allocator API; indices are int64 on `device`. `slots` are its free list's planned
    slots (kvcache.sizing.allocator_footprint.free_list_slots at page size 1), which say its `size` (usable
    tokens) and whether it checks frees; its buffers are their views in `views` (the builder's carve of the
    plan) or, given None, its own."""

    def __init__(self, *, slots: Sequence[PlannedSlot], device: torch.device | str, kvcache: Any = None,
                 views: Views | None = None) -> None:
        super().__init__(slots=slots, page_size=1, device=device, unit="token index", kvcache=kvcache, views=views)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size free token indices (a view kept until `size` more tokens are freed), or None when fewer are free."""
        if need_size < 0 or self._hot_device == -2:
            check_need_size(need_size, 1)
            reject_meta(self._device, "alloc")
        return self._log.take(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        """Give back token indices; outside a free group a flat int64 tensor on the device is appended as is."""
        if self.is_hot(free_index):
            self._log.put(free_index)
        else:
            super().free(free_index)  # the general path: conversions, checks, deferral

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """At page size 1 page ids are token indices."""
        self.free(page_ids)

    def _set_ids(self, indices: torch.Tensor) -> tuple[torch.Tensor, bool]:
        return indices, False

    def _segment_ids(self, indices: torch.Tensor) -> torch.Tensor:
        return indices
