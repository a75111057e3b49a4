"""How the SWA allocator frees: both sides of full indices, or one, resolving the full-to-SWA map at once.

The map is resolved when the free is called, not at a free group's end (SGLang 0.5.23: a later cache
action in the same group may map the same full index again); inside a free group both sides defer
their releases, with copies. Set frees (free, free_swa) sync once; segment frees never do.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.allocators.given import as_indices, reject_meta
from kvcache.allocators.free_group import FreeGroup
from kvcache.allocators.index_map import FullToSWAMap, page_rows, page_starts_of


class SWAFrees:
    """Mixed into SWATokenToKVPoolAllocator (kvcache.allocators.swa), whose state it uses."""

    full_attn_allocator: Any
    swa_attn_allocator: Any
    _map: FullToSWAMap
    _group: FreeGroup
    _device: torch.device
    _page_size: int
    _check: bool

    def _checked(self, op: str, indices: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        reject_meta(self._device, op)
        if start_pos % self._page_size:
            raise ValueError(f"segment start {start_pos} is not a multiple of page_size {self._page_size}")
        return as_indices(indices, self._device, "free_index")

    def free(self, free_index: torch.Tensor) -> None:
        """Release both sides of these full indices (a set: paged, every page they touch)."""
        if free_index.numel():
            self._free_now(self._checked("free", free_index))

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Release only the SWA slots of these tokens (they left the window); the full side stays held."""
        if free_index.numel():
            self._free_swa_now(self._checked("free_swa", free_index))

    def free_full(self, free_index: torch.Tensor) -> None:
        """Release only the full side (its SWA slots were freed already)."""
        if free_index.numel():
            self.full_attn_allocator.free(self._checked("free_full", free_index))

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Both sides of kv_row[start_pos : start_pos + n] of one request (page-aligned start): no host sync."""
        if free_index.numel():
            full = self._checked("free_segment", free_index, start_pos)
            self._free_swa_segment_now(full)
            self.full_attn_allocator.free_segment(full, start_pos=start_pos)

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if free_index.numel():
            self._free_swa_segment_now(self._checked("free_swa_segment", free_index, start_pos))

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if free_index.numel():
            self.full_attn_allocator.free_segment(self._checked("free_full_segment", free_index, start_pos),
                                                  start_pos=start_pos)

    def _free_now(self, full: torch.Tensor) -> None:
        starts = page_starts_of(full, self._page_size)
        held = self._map.held_swa_pages(starts, self._page_size, check=self._check)
        if self._group.is_open:  # another free() in this group may touch these pages: deferred as a set
            self.full_attn_allocator.free(starts)
        else:
            self.full_attn_allocator.free_page_starts(starts)  # with check_frees this raises before anything changed
        if held.numel():
            self.swa_attn_allocator.free_page_starts(held)
        self._map.write(page_rows(starts, self._page_size), 0)

    def _free_swa_now(self, full: torch.Tensor) -> None:
        starts = page_starts_of(full, self._page_size)
        held = self._map.held_swa_pages(starts, self._page_size, check=self._check)
        if held.numel():
            self.swa_attn_allocator.free_page_starts(held)
            self._map.write(page_rows(starts, self._page_size), 0)

    def _free_swa_segment_now(self, full: torch.Tensor) -> None:
        firsts = full[:: self._page_size]  # the first full index of every page in the segment
        swa_starts = self._map.lookup(firsts)
        if self._check and bool((swa_starts <= 0).any()):
            raise ValueError("free_swa_segment of a segment whose SWA slots are already free (use free_full_segment)")
        self.swa_attn_allocator.free_page_starts(swa_starts)
        self._map.write(page_rows(firsts, self._page_size), 0)

