"""PagedTokenToKVPoolAllocator: whole pages; page p holds token indices p*page_size .. p*page_size+page_size-1.

Pages are numbered 1..size//page_size; page 0 (tokens 0..page_size-1) is the pool's
padding and is never handed out. The free list holds pages, so alloc and free cost
O(pages in the call) whatever the pool size. alloc_extend / alloc_decode continue
each request's partial last page before taking fresh ones, in vectorised torch ops
with one host sync (for the number of fresh pages, which sizes the pop); callers that
already know it (the SWA allocator, a scheduler with CPU copies) pass num_new_pages.
free frees whole pages: torch.unique(indices // page_size), as SGLang does.
alloc_extend always validates its batch (the sync is paid anyway); alloc_decode
checks seq_lens >= 1 only with check_frees, to keep decode at one reduction.
"""

from __future__ import annotations

import torch

from kvcache.allocators.base import FreeListAllocator, as_indices, check_need_size, reject_meta
from kvcache.allocators.locations import decode_locations, decode_starts_page, extend_locations, extend_pages


class PagedTokenToKVPoolAllocator(FreeListAllocator):
    """SGLang's paged allocator API; `size` usable tokens in pages of `page_size`."""

    def __init__(self, *, size: int, page_size: int, device: torch.device | str, check_frees: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size or size % page_size:
            raise ValueError(f"size {size} must be a positive multiple of page_size {page_size}")
        super().__init__(capacity=size // page_size, page_size=page_size, device=device,
                         check_frees=check_frees, unit="page")

    @property
    def num_pages(self) -> int:
        """Usable pages (1..num_pages)."""
        return self._stack.capacity

    def _tokens_of(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self._page_size, dtype=torch.int64, device=self._device)
        return (pages[:, None] * self._page_size + offsets).reshape(-1)

    def _lens(self, lens: torch.Tensor, what: str) -> torch.Tensor:
        return as_indices(lens, self._device, what)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Token indices of need_size // page_size whole pages, or None (allocating nothing)."""
        check_need_size(need_size, self._page_size)
        reject_meta(self._device, "alloc")
        pages = self._stack.pop(need_size // self._page_size, copy=False)
        return None if pages is None else self._tokens_of(pages)

    def extend_pages_needed(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, extend_num_tokens: int) -> int:
        """Fresh pages alloc_extend would take; validates the batch (one host sync)."""
        reject_meta(self._device, "extend_pages_needed")
        prefix, seq = self._lens(prefix_lens, "prefix_lens"), self._lens(seq_lens, "seq_lens")
        if prefix.numel() != seq.numel():
            raise ValueError(f"prefix_lens has {prefix.numel()} requests but seq_lens has {seq.numel()}")
        if prefix.numel() == 0:
            if extend_num_tokens != 0:
                raise ValueError(f"extend_num_tokens is {extend_num_tokens} for an empty batch")
            return 0
        lengths = seq - prefix
        stats = torch.stack([extend_pages(prefix, seq, self._page_size).sum(), lengths.sum(), lengths.min(), prefix.min()])
        pages, tokens, shortest, lowest_prefix = stats.tolist()
        if lowest_prefix < 0:
            raise ValueError(f"prefix_lens must be >= 0, got {lowest_prefix}")
        if shortest < 0:
            raise ValueError(f"seq_lens must be >= prefix_lens; one request has seq_lens - prefix_lens = {shortest}")
        if tokens != extend_num_tokens:
            raise ValueError(f"extend_num_tokens is {extend_num_tokens} but sum(seq_lens - prefix_lens) is {tokens}")
        return int(pages)

    def alloc_extend(
        self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
        *, num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """Indices for positions prefix_lens[i]..seq_lens[i]-1 of each request, flat in request order.

        None (allocating nothing) when too few pages are free. num_new_pages, when given,
        must equal extend_pages_needed(...) and skips its validation and sync.
        """
        reject_meta(self._device, "alloc_extend")
        if num_new_pages is None:
            num_new_pages = self.extend_pages_needed(prefix_lens, seq_lens, extend_num_tokens)
        prefix, seq = self._lens(prefix_lens, "prefix_lens"), self._lens(seq_lens, "seq_lens")
        last = self._lens(last_loc, "last_loc")
        if last.numel() != prefix.numel():
            raise ValueError(f"last_loc has {last.numel()} entries for {prefix.numel()} requests")
        pages = self._stack.pop(num_new_pages, copy=False)
        if pages is None:
            return None
        return extend_locations(prefix_lens=prefix, seq_lens=seq, last_loc=last, new_pages=pages,
                                page_size=self._page_size, num_tokens=extend_num_tokens)

    def decode_pages_needed(self, seq_lens: torch.Tensor) -> int:
        """Fresh pages alloc_decode would take (one host sync)."""
        reject_meta(self._device, "decode_pages_needed")
        return self._decode_pages(self._lens(seq_lens, "seq_lens"))[1]

    def _decode_pages(self, seq: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Which requests start a page, and how many; with check_frees also that every seq_len is >= 1."""
        starts = decode_starts_page(seq, self._page_size)
        if self._checking and seq.numel() and int(seq.min()) < 1:
            raise ValueError(f"seq_lens must be >= 1 (they include the new token), got {int(seq.min())}")
        return starts, int(starts.sum())

    def alloc_decode(
        self, seq_lens: torch.Tensor, last_loc: torch.Tensor, *, num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """One index per request for position seq_lens[i]-1: a fresh page's first token, or last_loc[i]+1.

        None (allocating nothing) when too few pages are free. num_new_pages, when given,
        must equal decode_pages_needed(seq_lens) and skips its host sync.
        """
        reject_meta(self._device, "alloc_decode")
        seq, last = self._lens(seq_lens, "seq_lens"), self._lens(last_loc, "last_loc")
        if last.numel() != seq.numel():
            raise ValueError(f"last_loc has {last.numel()} entries for {seq.numel()} requests")
        if num_new_pages is None:
            starts, num_new_pages = self._decode_pages(seq)
        else:
            starts = decode_starts_page(seq, self._page_size)
        pages = self._stack.pop(num_new_pages, copy=False)
        if pages is None:
            return None
        return decode_locations(starts_page=starts, last_loc=last, new_pages=pages, page_size=self._page_size)

    def _release(self, indices: torch.Tensor) -> None:
        self._stack.push(torch.unique(indices // self._page_size))
