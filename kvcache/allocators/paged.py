"""PagedTokenToKVPoolAllocator: hands out whole pages; page p holds tokens p*page_size ... p*page_size+page_size-1.

Page 0 (the padding rows) is never handed out. alloc_extend and alloc_decode
continue a request's partial last page before taking fresh pages, with vectorised
torch ops (one host sync per call, for the number of new pages).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache.allocators.free_stack import FreeStack, FreeStackState


@dataclass(frozen=True, slots=True)
class PagedAllocatorState:
    free_pages: FreeStackState


def _ceil_div(a: torch.Tensor, b: int) -> torch.Tensor:
    return (a + b - 1) // b


class PagedTokenToKVPoolAllocator:
    """SGLang's paged allocator API over a FreeStack of page ids."""

    def __init__(self, *, size: int, page_size: int, device: torch.device, check_frees: bool = False) -> None:
        if page_size < 1 or size < page_size or size % page_size:
            raise ValueError(f"size {size} must be a positive multiple of page_size {page_size}")
        self._page = page_size
        self._size = size
        self._device = device
        self._free = FreeStack(capacity=size // page_size, device=device, check=check_frees)
        self._group: list[torch.Tensor] | None = None

    size = property(lambda self: self._size)
    page_size = property(lambda self: self._page)
    device = property(lambda self: self._device)

    def _tokens_of(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self._page, dtype=torch.int64, device=self._device)
        return (pages[:, None] * self._page + offsets).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self._page:
            raise ValueError(f"paged alloc needs a multiple of page_size {self._page} tokens, got {need_size}")
        pages = self._free.pop(need_size // self._page)
        return None if pages is None else self._tokens_of(pages)

    def pages_needed_for_extend(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """New pages each request needs to grow from prefix_lens to seq_lens."""
        return _ceil_div(seq_lens, self._page) - _ceil_div(prefix_lens, self._page)

    def alloc_extend(
        self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Indices for positions prefix_lens[i]..seq_lens[i]-1 of each request, in request order."""
        ps = self._page
        prefix, seq, last = (t.to(self._device, torch.int64) for t in (prefix_lens, seq_lens, last_loc))
        new_pages = self.pages_needed_for_extend(prefix, seq)
        pages = self._free.pop(int(new_pages.sum()))
        if pages is None:
            return None
        lengths = seq - prefix
        req = torch.repeat_interleave(torch.arange(lengths.numel(), device=self._device), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        pos = prefix[req] + torch.arange(req.numel(), device=self._device) - starts[req]
        first_new_page = _ceil_div(prefix, ps)
        in_partial = pos < first_new_page[req] * ps
        page_base = torch.cumsum(new_pages, 0) - new_pages
        k = (pos // ps - first_new_page[req]).clamp(min=0)
        slot = (page_base[req] + k).clamp(max=max(pages.numel() - 1, 0))
        fresh = pages[slot] * ps + pos % ps if pages.numel() else pos
        out = torch.where(in_partial, last[req] + pos - prefix[req] + 1, fresh)
        if out.numel() != extend_num_tokens:
            raise ValueError(f"extend_num_tokens {extend_num_tokens} != sum(seq_lens - prefix_lens) = {out.numel()}")
        return out

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One index per request, for position seq_lens[i]-1: a fresh page when that position starts one."""
        ps = self._page
        seq, last = seq_lens.to(self._device, torch.int64), last_loc.to(self._device, torch.int64)
        needs_page = (seq - 1) % ps == 0
        pages = self._free.pop(int(needs_page.sum()))
        if pages is None:
            return None
        if pages.numel() == 0:
            return last + 1
        which = (torch.cumsum(needs_page.to(torch.int64), 0) - 1).clamp(min=0)
        return torch.where(needs_page, pages[which] * ps, last + 1)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self._group is not None:
            self._group.append(free_index)
            return
        self._free.push(torch.unique(free_index.to(torch.int64) // self._page))

    def free_group_begin(self) -> None:
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self.free(torch.cat(group))

    def available_size(self) -> int:
        return self._free.available * self._page

    def clear(self) -> None:
        self._group = None
        self._free.reset()

    def backup_state(self) -> PagedAllocatorState:
        return PagedAllocatorState(self._free.backup())

    def restore_state(self, state: PagedAllocatorState) -> None:
        self._free.restore(state.free_pages)

    @property
    def nbytes(self) -> int:
        return self._free.nbytes
