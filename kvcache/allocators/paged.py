"""PagedTokenToKVPoolAllocator: whole pages; page p holds token indices p*page_size .. p*page_size+page_size-1.

Pages are numbered 1..size//page_size; page 0 (tokens 0..page_size-1) is the pool's
padding and is never handed out. The free log holds each free page's first token
index (p * page_size), so a page-aligned row segment frees by appending every
page_size-th index of it, with no division and no torch.unique.

No host sync in steady state (SGLang 0.5.23's argument lists): alloc_extend and
alloc_decode plan on the host from the CPU copies of the lengths the scheduler
passes (kvcache.allocators.locations), send the plan with one asynchronous copy, and
finish with a gather and an add on the device (decode: an add and an index_copy).
free_segment / free_page_ids append (one kernel). Only free() of an arbitrary token
set, whose page count is data-dependent, runs torch.unique and so syncs, as SGLang's does.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.allocators.base import FreeListAllocator, as_indices, check_need_size, reject_meta
from kvcache.allocators.locations import ExtendPlan, check_extend_lengths, decode_starts_page, host_lengths, plan_extend


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on device without a host sync: through pinned memory and a non-blocking copy."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class PagedTokenToKVPoolAllocator(FreeListAllocator):
    """SGLang 0.5.23's paged allocator API; `size` usable tokens in pages of `page_size`."""

    def __init__(
        self, *, size: int, page_size: int, device: torch.device | str, check_frees: bool = False, kvcache: Any = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size or size % page_size:
            raise ValueError(f"size {size} must be a positive multiple of page_size {page_size}")
        super().__init__(capacity=size // page_size, page_size=page_size, device=device,
                         check_frees=check_frees, unit="page", kvcache=kvcache)

    @property
    def num_pages(self) -> int:
        """Usable pages (1..num_pages)."""
        return self._log.capacity

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Token indices of need_size // page_size whole pages, or None (allocating nothing)."""
        check_need_size(need_size, self._page_size)
        reject_meta(self._device, "alloc")
        starts = self._log.take(need_size // self._page_size)
        if starts is None:
            return None
        offsets = torch.arange(self._page_size, dtype=torch.int64, device=self._device)
        return torch.add(offsets, starts[:, None]).reshape(-1)

    def alloc_extend(
        self, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor, seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int, num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """Indices for positions prefix_lens[i]..seq_lens[i]-1 of each request, flat in request order.

        None (allocating nothing) when too few pages are free. The device lengths are
        not read: the CPU copies plan the batch (and num_new_pages, if given, must agree).
        """
        reject_meta(self._device, "alloc_extend")
        plan, last = self._plan_extend(prefix_lens_cpu, seq_lens_cpu, last_loc, extend_num_tokens)
        if num_new_pages is not None and num_new_pages != plan.num_new_pages:
            raise ValueError(f"num_new_pages is {num_new_pages} but the lengths need {plan.num_new_pages}")
        return self._extend_with(plan, last)

    def _plan_extend(
        self, prefix_lens_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
    ) -> tuple[ExtendPlan, torch.Tensor]:
        """Validate the batch and plan it on the host (shared with the SWA allocator's two sides)."""
        prefix, seq = host_lengths(prefix_lens_cpu, "prefix_lens_cpu"), host_lengths(seq_lens_cpu, "seq_lens_cpu")
        tokens = check_extend_lengths(prefix, seq, extend_num_tokens)
        last = as_indices(last_loc, self._device, "last_loc")
        if last.numel() != prefix.numel():
            raise ValueError(f"last_loc has {last.numel()} entries for {prefix.numel()} requests")
        return plan_extend(prefix, seq, self._page_size, tokens), last

    def _extend_with(self, plan: ExtendPlan, last: torch.Tensor) -> torch.Tensor | None:
        starts = self._log.take(plan.num_new_pages)
        if starts is None:
            return None
        return self._locations(plan.gather_offset, starts, last if plan.continues_a_page else None)

    def _locations(self, gather_offset: torch.Tensor, starts: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        """out = source[gather] + offset on the device (kvcache.allocators.locations)."""
        plan = to_device_async(gather_offset, self._device)
        source = starts
        if last is not None:
            batch = last.numel()
            source = torch.empty(batch + starts.numel(), dtype=torch.int64, device=self._device)
            torch.add(last, 1, out=source[:batch])
            source[batch:].copy_(starts)
        return torch.index_select(source, 0, plan[0]).add_(plan[1])

    def alloc_decode(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One index per request for position seq_lens[i]-1: a fresh page's first token, or last_loc[i]+1.

        None (allocating nothing) when too few pages are free. seq_lens_cpu decides which
        requests start a page; the device seq_lens is not read.
        """
        reject_meta(self._device, "alloc_decode")
        return self._decode_with(*self._plan_decode(seq_lens_cpu, last_loc))

    def _plan_decode(self, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
        """Which requests start a page (CPU positions), the batch size, and last_loc on the device."""
        seq = host_lengths(seq_lens_cpu, "seq_lens_cpu")
        last = as_indices(last_loc, self._device, "last_loc")
        if last.numel() != seq.numel():
            raise ValueError(f"last_loc has {last.numel()} entries for {seq.numel()} requests")
        if self._checking and seq.numel() and int(seq.min()) < 1:
            raise ValueError(f"seq_lens must be >= 1 (they include the new token), got {int(seq.min())}")
        starting = decode_starts_page(seq, self._page_size).nonzero().squeeze(1)
        return starting, seq.numel(), last

    def _decode_with(self, starting: torch.Tensor, batch: int, last: torch.Tensor) -> torch.Tensor | None:
        """starting: CPU positions of the requests that start a page."""
        count = starting.numel()
        starts = self._log.take(count)
        if starts is None:
            return None
        if count == batch:  # every request starts a page (a view: see FreeLog's guarantee)
            return starts
        if last.dtype == torch.int64:
            out = last + 1
        else:
            out = torch.empty(batch, dtype=torch.int64, device=self._device)
            torch.add(last, 1, out=out)
        if count:
            out.index_copy_(0, to_device_async(starting, self._device), starts)
        return out

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Free exactly these pages (no repeats; SGLang 0.5.23's free_page_ids)."""
        if page_ids.numel() == 0:
            return
        reject_meta(self._device, "free_page_ids")
        self._put_starts(as_indices(page_ids, self._device, "page_ids"), multiply=self._page_size)

    def _set_ids(self, indices: torch.Tensor) -> tuple[torch.Tensor, bool]:
        return indices - indices % self._page_size, True

    def _segment_ids(self, indices: torch.Tensor) -> torch.Tensor:
        return indices[:: self._page_size]
