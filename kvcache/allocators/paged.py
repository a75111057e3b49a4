"""PagedTokenToKVPoolAllocator: whole pages; page p holds token indices p*page_size .. p*page_size+page_size-1.

Pages are numbered 1..size//page_size; page 0 (tokens 0..page_size-1) is the pool's
padding and is never handed out. The free log holds each free page's first token
index (p * page_size), so a page-aligned row segment frees by appending every
page_size-th index of it, with no division and no torch.unique.

No host sync in steady state (SGLang 0.5.23's argument lists). The host counts the fresh
pages a batch takes from the CPU copies of the lengths the scheduler passes and takes them
from the free log; then, on CUDA, one Triton launch writes every new index
(kvcache.allocators.paged_kernels). Elsewhere (or without Triton) an extend of up to
SMALL_BATCH requests is split into runs on the host (two broadcast adds and one cat on the
device); a larger one is planned per token on the host and finished with a gather and an add
(kvcache.allocators.locations); decode is an add and an index_copy. free_segment / free_page_ids append (one kernel).
Only free() of an arbitrary token set, whose page count is data-dependent, runs
torch.unique and so syncs, as SGLang's does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from kvcache.allocators import paged_kernels
from kvcache.allocators.base import FreeListAllocator
from kvcache.allocators.given import INDEX_DTYPES, as_indices, check_need_size, reject_meta
from kvcache.pools.planned_views import Views
from kvcache.sizing.tensor_plan import PlannedSlot
from kvcache.allocators.locations import (
    SMALL_BATCH,
    DecodeBatch,
    ExtendBatch,
    ExtendPlan,
    ExtendSplit,
    check_extend_lengths,
    count_decode_pages,
    count_extend_pages,
    decode_starts_page,
    host_lengths,
    plan_extend,
    split_extend,
    to_device_async,
)
from kvcache.allocators.paged_kernels import PagedKernels


class PagedTokenToKVPoolAllocator(FreeListAllocator):
    """SGLang 0.5.23's paged allocator API; `size` usable tokens in pages of `page_size`. `slots` are its free
    list's planned slots (kvcache.sizing.allocator_footprint.free_list_slots: one id per page), which say its
    size and whether it checks frees; its buffers are their views in `views`, or, given None, its own.

    kernels: "auto" runs paged_kernels.load() on CUDA (Triton) and plans on the host elsewhere;
    None always plans on the host; a PagedKernels instance is used as given.
    """

    def __init__(
        self, *, slots: Sequence[PlannedSlot], page_size: int, device: torch.device | str, kvcache: Any = None,
        kernels: PagedKernels | None | Literal["auto"] = "auto", views: Views | None = None,
    ) -> None:
        super().__init__(slots=slots, page_size=page_size, device=device, unit="page", kvcache=kvcache, views=views)
        if kernels == "auto":
            kernels = paged_kernels.load() if self._device.type == "cuda" else None
        self._kernels: PagedKernels | None = kernels

    @functools.cached_property
    def _offsets(self) -> torch.Tensor:
        """0..page_size, the row offsets of the host path's runs: made on first use, so an allocator whose steps
        run as kernels holds no memory outside the plan's buffers."""
        return torch.arange(self._page_size + 1, dtype=torch.int64, device=self._device)

    @property
    def num_pages(self) -> int:
        """Usable pages (1..num_pages)."""
        return self._log.capacity

    @property
    def uses_device_kernels(self) -> bool:
        """Whether paged steps run as one Triton launch (else the host plans them)."""
        return self._kernels is not None

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Token indices of need_size // page_size whole pages, or None (allocating nothing)."""
        check_need_size(need_size, self._page_size)
        reject_meta(self._device, "alloc")
        n = need_size // self._page_size

        def expand(head: int) -> torch.Tensor:
            offsets = torch.arange(self._page_size, dtype=torch.int64, device=self._device)
            return torch.add(offsets, self._log.buffer[head:head + n, None]).reshape(-1)
        return self._on_new_pages(n, expand)

    def alloc_extend(
        self, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor, seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int, num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """Indices for positions prefix_lens[i]..seq_lens[i]-1 of each request, flat in request order.

        None (allocating nothing) when too few pages are free. The CPU copies count the
        pages (num_new_pages, if given, must agree); the device lengths are read only by the
        CUDA kernel, and must equal the CPU copies.
        """
        reject_meta(self._device, "alloc_extend")
        batch, last = self._count_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens)
        if num_new_pages is not None and num_new_pages != batch.num_new_pages:
            raise ValueError(f"num_new_pages is {num_new_pages} but the lengths need {batch.num_new_pages}")
        return self._extend_with(batch, last)

    def _count_extend(
        self, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor, seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
    ) -> tuple[ExtendBatch, torch.Tensor]:
        """Validate the batch and count (or plan) it on the host (shared with the SWA allocator's two sides)."""
        prefix, seq = host_lengths(prefix_lens_cpu, "prefix_lens_cpu"), host_lengths(seq_lens_cpu, "seq_lens_cpu")
        last = as_indices(last_loc, self._device, "last_loc")
        if last.numel() != prefix.numel():
            raise ValueError(f"last_loc has {last.numel()} entries for {prefix.numel()} requests")
        if self._kernels is None and prefix.numel() <= SMALL_BATCH:
            split = split_extend(prefix, seq, self._page_size, extend_num_tokens)
            return ExtendBatch(split.num_new_pages, extend_num_tokens, prefix_lens, seq_lens, None, split), last
        if self._kernels is None:
            tokens = check_extend_lengths(prefix, seq, extend_num_tokens)
            plan = plan_extend(prefix, seq, self._page_size, tokens)
            return ExtendBatch(plan.num_new_pages, tokens, prefix_lens, seq_lens, plan), last
        pages = count_extend_pages(prefix, seq, self._page_size, extend_num_tokens)
        device_prefix = as_indices(prefix_lens, self._device, "prefix_lens")
        device_seq = as_indices(seq_lens, self._device, "seq_lens")
        if device_prefix.numel() != prefix.numel() or device_seq.numel() != prefix.numel():
            raise ValueError(f"prefix_lens/seq_lens have {device_prefix.numel()}/{device_seq.numel()} entries "
                             f"for {prefix.numel()} requests")
        if self._checking:
            self._check_same_lengths((device_prefix, prefix, "prefix_lens"), (device_seq, seq, "seq_lens"))
        return ExtendBatch(pages, extend_num_tokens, device_prefix, device_seq, None), last

    @staticmethod
    def _check_same_lengths(*pairs: tuple[torch.Tensor, torch.Tensor, str]) -> None:
        """check_frees only (it syncs): the device lengths the kernel reads equal the CPU copies the host counted."""
        for device, host, what in pairs:
            if not torch.equal(device.cpu().to(torch.int64), host):
                raise ValueError(f"{what} on the device differs from {what}_cpu: the scheduler passed stale copies")

    def _extend_with(self, batch: ExtendBatch, last: torch.Tensor) -> torch.Tensor | None:
        n = batch.num_new_pages
        if batch.split is not None:
            split = batch.split
            return self._on_new_pages(n, lambda head: self._runs(split, self._log.buffer[head:head + n], last))
        if self._kernels is None:
            assert batch.plan is not None
            plan = batch.plan
            return self._on_new_pages(n, lambda head: self._locations(plan, self._log.buffer[head:head + n], last))

        def launch(head: int) -> torch.Tensor:
            out = torch.empty(batch.num_tokens, dtype=torch.int64, device=self._device)
            if batch.num_tokens:
                assert self._kernels is not None
                self._kernels.alloc_extend(batch.prefix_lens, batch.seq_lens, last, self._log.buffer, head, out,
                                           self._page_size)
            return out
        return self._on_new_pages(n, launch)

    def _on_new_pages(self, count: int, build: Callable[[int], torch.Tensor]) -> torch.Tensor | None:
        """Take `count` pages and build the step's indices from where they start in the free log; None when too
        few are free. If building fails (the device out of memory, a kernel that will not launch) the pages go
        back, so a failed step leaves the free list as it was."""
        head = self._log.take_at(count)
        if head is None:
            return None
        try:
            return build(head)
        except BaseException:
            self._log.untake(head, count)
            raise

    def _runs(self, split: ExtendSplit, starts: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """A small batch on the device (kvcache.allocators.locations.ExtendSplit): two broadcast adds, views, one cat."""
        if not split.num_tokens:
            return torch.empty(0, dtype=torch.int64, device=self._device)
        runs: list[tuple[torch.Tensor, ...]] = []
        if split.continues_a_page:
            runs.append(torch.add(last[:, None], self._offsets[1:]).reshape(-1).split(split.partial_sizes)[::2])
        if split.num_new_pages:
            runs.append(torch.add(starts[:, None], self._offsets[:-1]).reshape(-1).split(split.fresh_sizes)[::2])
        # request by request, its continuation then its fresh tokens; empty runs left out (they slow cat down)
        return torch.cat([run for pair in zip(*runs) for run in pair if run.shape[0]])

    def _locations(self, plan: ExtendPlan, starts: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Scatter the source, then out = source[gather] + offset on the device (kvcache.allocators.locations)."""
        slots, shift, fresh_slots, gather, offset = plan.sections(to_device_async(plan.packed, self._device))
        source = torch.empty(plan.batch + plan.num_new_pages, dtype=torch.int64, device=self._device)
        if plan.continues_a_page:
            source.index_copy_(0, slots, last + shift)
        if plan.num_new_pages:
            source.index_copy_(0, fresh_slots, starts)
        return torch.index_select(source, 0, gather).add_(offset)

    def alloc_decode(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        """One index per request for position seq_lens[i]-1: a fresh page's first token, or last_loc[i]+1.

        None (allocating nothing) when too few pages are free. seq_lens_cpu counts the
        requests that start a page; the device seq_lens is read only by the CUDA kernel.
        """
        if (self._kernels is not None and self._hot_device != -2 and seq_lens_cpu.dtype is torch.int64
                and seq_lens_cpu.ndim == 1 and seq_lens_cpu.get_device() == -1 and last_loc.ndim == 1
                and last_loc.get_device() == self._hot_device == seq_lens.get_device() and seq_lens.ndim == 1
                and seq_lens_cpu.shape[0] == last_loc.shape[0] == seq_lens.shape[0]
                and last_loc.dtype in INDEX_DTYPES and seq_lens.dtype in INDEX_DTYPES):
            # a CUDA decode step's hot path: the arguments are what _count_decode would make of them
            return self._decode_on_device(seq_lens, last_loc, count_decode_pages(seq_lens_cpu, self._page_size))
        reject_meta(self._device, "alloc_decode")
        return self._decode_with(*self._count_decode(seq_lens, seq_lens_cpu, last_loc))

    def _count_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor,
    ) -> tuple[DecodeBatch, torch.Tensor]:
        """The batch counted on the host (shared with the SWA allocator's two sides), and last_loc on the device."""
        seq = host_lengths(seq_lens_cpu, "seq_lens_cpu")
        last = as_indices(last_loc, self._device, "last_loc")
        if last.numel() != seq.numel():
            raise ValueError(f"last_loc has {last.numel()} entries for {seq.numel()} requests")
        if self._checking and seq.numel() and int(seq.min()) < 1:
            raise ValueError(f"seq_lens must be >= 1 (they include the new token), got {int(seq.min())}")
        if self._kernels is None:
            starting = decode_starts_page(seq, self._page_size).nonzero().squeeze(1)
            return DecodeBatch(starting.numel(), seq_lens, starting), last
        device_seq = as_indices(seq_lens, self._device, "seq_lens")
        if device_seq.numel() != seq.numel():
            raise ValueError(f"seq_lens has {device_seq.numel()} entries for {seq.numel()} requests")
        if self._checking:
            self._check_same_lengths((device_seq, seq, "seq_lens"))
        return DecodeBatch(count_decode_pages(seq, self._page_size), device_seq, None), last

    def _decode_on_device(self, seq_lens: torch.Tensor, last: torch.Tensor, count: int) -> torch.Tensor | None:
        """The kernel path: take `count` pages, one launch writes every index."""
        size = last.shape[0]

        def launch(head: int) -> torch.Tensor:
            if count == size:  # every request starts a page (a view: see FreeLog's guarantee)
                return self._log.buffer[head:head + count]
            out = torch.empty(size, dtype=torch.int64, device=self._device)
            assert self._kernels is not None
            self._kernels.alloc_decode(seq_lens, last, self._log.buffer, head, out, self._page_size)
            return out
        return self._on_new_pages(count, launch)

    def _decode_with(self, batch: DecodeBatch, last: torch.Tensor) -> torch.Tensor | None:
        count, size = batch.num_new_pages, last.numel()
        if self._kernels is not None:
            return self._decode_on_device(batch.seq_lens, last, count)

        def place(head: int) -> torch.Tensor:
            starts = self._log.buffer[head:head + count]
            if count == size:
                return starts
            if last.dtype == torch.int64:
                out = last + 1
            else:
                out = torch.empty(size, dtype=torch.int64, device=self._device)
                torch.add(last, 1, out=out)
            if count:
                assert batch.starting is not None
                out.index_copy_(0, to_device_async(batch.starting, self._device), starts)
            return out
        return self._on_new_pages(count, place)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Free exactly these pages (no repeats; SGLang 0.5.23's free_page_ids)."""
        if self.is_hot(page_ids):
            self._log.put(page_ids, multiply=self._page_size)
            return
        if page_ids.numel() == 0:
            return
        reject_meta(self._device, "free_page_ids")
        self._put_starts(as_indices(page_ids, self._device, "page_ids"), multiply=self._page_size)

    def _set_ids(self, indices: torch.Tensor) -> tuple[torch.Tensor, bool]:
        return indices - indices % self._page_size, True

    def _segment_ids(self, indices: torch.Tensor) -> torch.Tensor:
        return indices[:: self._page_size]
