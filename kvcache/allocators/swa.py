"""SWATokenToKVPoolAllocator: pairs a full-pool allocator with a smaller sliding-window one.

Callers hold full-pool indices; `full_to_swa_index_mapping` says which SWA row each
one uses. free_swa releases the SWA side of tokens that fell out of the window, so
the SWA pool only needs to hold the live windows. While a backup is live, mapping
writes are journaled so restore leaves the mapping consistent with the free sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.allocators.paged import PagedTokenToKVPoolAllocator
from kvcache.allocators.token import TokenToKVPoolAllocator


@dataclass(frozen=True, slots=True)
class SWAAllocatorState:
    full: Any
    swa: Any
    generation: int


def _side(size: int, page_size: int, device: torch.device, check: bool) -> Any:
    if page_size == 1:
        return TokenToKVPoolAllocator(size=size, device=device, check_frees=check)
    return PagedTokenToKVPoolAllocator(size=size, page_size=page_size, device=device, check_frees=check)


class SWATokenToKVPoolAllocator:
    """Full and SWA allocators behind one API; indices handed out are full-pool indices."""

    def __init__(self, *, full_size: int, swa_size: int, page_size: int, device: torch.device, check_frees: bool = False) -> None:
        self._full = _side(full_size, page_size, device, check_frees)
        self._swa = _side(swa_size, page_size, device, check_frees)
        self._page = page_size
        self._device = device
        self._map = torch.zeros(full_size + page_size, dtype=torch.int64, device=device)
        self._group: list[torch.Tensor] | None = None
        self._generation = 0
        self._journal: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    size = property(lambda self: self._full.size)
    swa_size = property(lambda self: self._swa.size)
    page_size = property(lambda self: self._page)
    device = property(lambda self: self._device)
    full_to_swa_index_mapping = property(lambda self: self._map)

    def _set_map(self, full_idx: torch.Tensor, values: torch.Tensor) -> None:
        if self._journal is not None:
            self._journal.append((full_idx.clone(), self._map[full_idx].clone()))
        self._map[full_idx] = values

    def translate_loc_from_full_to_swa(self, full_indices: torch.Tensor) -> torch.Tensor:
        return self._map[full_indices]

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > self.available_size():
            return None
        full, swa = self._full.alloc(need_size), self._swa.alloc(need_size)
        assert full is not None and swa is not None
        self._set_map(full, swa)
        return full

    def alloc_extend(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor,
                     extend_num_tokens: int) -> torch.Tensor | None:
        pages = int(self._full.pages_needed_for_extend(prefix_lens, seq_lens).sum()) * self._page
        if pages > self._full.available_size() or pages > self._swa.available_size():
            return None
        swa_last = torch.where(last_loc > 0, self._map[last_loc.clamp(min=0)], last_loc)
        full = self._full.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        swa = self._swa.alloc_extend(prefix_lens, seq_lens, swa_last, extend_num_tokens)
        assert full is not None and swa is not None
        self._set_map(full, swa)
        return full

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        pages = int(((seq_lens - 1) % self._page == 0).sum()) * self._page
        if pages > self._full.available_size() or pages > self._swa.available_size():
            return None
        swa_last = self._map[last_loc]
        full = self._full.alloc_decode(seq_lens, last_loc)
        swa = self._swa.alloc_decode(seq_lens, swa_last)
        assert full is not None and swa is not None
        self._set_map(full, swa)
        return full

    def free_swa(self, full_indices: torch.Tensor) -> None:
        """Release the SWA slots of tokens that left the window; the full side stays held."""
        if full_indices.numel() == 0:
            return
        swa = self._map[full_indices]
        held = swa > 0
        if bool(held.any()):
            self._swa.free(swa[held])
            self._set_map(full_indices[held], torch.zeros_like(swa[held]))

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self._group is not None:
            self._group.append(free_index)
            return
        self.free_swa(free_index)
        self._full.free(free_index)

    def free_group_begin(self) -> None:
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self.free(torch.cat(group))

    def available_size(self) -> int:
        return min(self._full.available_size(), self._swa.available_size())

    def full_available_size(self) -> int:
        return self._full.available_size()

    def swa_available_size(self) -> int:
        return self._swa.available_size()

    def clear(self) -> None:
        self._group = None
        self._journal = None
        self._generation += 1
        self._full.clear()
        self._swa.clear()
        self._map.zero_()

    def backup_state(self) -> SWAAllocatorState:
        self._generation += 1
        self._journal = []
        return SWAAllocatorState(self._full.backup_state(), self._swa.backup_state(), self._generation)

    def restore_state(self, state: SWAAllocatorState) -> None:
        if state.generation != self._generation or self._journal is None:
            raise ValueError("this allocator state is not the latest backup of this allocator")
        self._full.restore_state(state.full)
        self._swa.restore_state(state.swa)
        for full_idx, old in reversed(self._journal):
            self._map[full_idx] = old
        self._journal = []

    @property
    def nbytes(self) -> int:
        return self._full.nbytes + self._swa.nbytes + self._map.numel() * self._map.element_size()
