"""Where each new token of a batch goes in a paged pool, planned on the host from the CPU lengths.

SGLang 0.5.23's scheduler passes CPU copies of prefix_lens and seq_lens. From them the
host works out everything that does not depend on device values: how many fresh pages
the batch takes and, for every new token, which page of a "source" list it lands in and
at what offset. The device then scatters the source and does one gather and one add
(kvcache.allocators.paged; on CUDA one Triton kernel does it all instead,
kvcache.allocators.paged_kernels):

    source[slot_r]          = last_loc[r] + 1 - prefix[r] % P   (the page request r continues)
    source[slot_r + 1 + i]  = first token of request r's i-th fresh page
    out[t]                  = source[gather[t]] + position(t) % P

A request at positions prefix..seq-1 first fills its partial last page (continuing
from last_loc, the index of position prefix-1), then takes its share of the fresh
pages, in request order. Page p holds token indices p*page_size .. p*page_size+page_size-1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from kvcache.arithmetic import ceil_div


@dataclass(frozen=True, slots=True)
class ExtendPlan:
    """Host tensors for one alloc_extend (see the module docstring), packed for one copy to the device."""

    num_new_pages: int
    num_tokens: int
    batch: int
    continues_a_page: bool  # some token continues a request's partial page (the source needs last_loc)
    packed: torch.Tensor  # int64 on the CPU: partial slots [batch], 1 - prefix % P [batch],
    #                       fresh slots [num_new_pages], gather [num_tokens], offset [num_tokens]

    def sections(self, packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """packed (or its copy on the device) split into its five parts."""
        b, n, t = self.batch, self.num_new_pages, self.num_tokens
        return torch.split(packed, (b, b, n, t, t))


def host_lengths(lengths: torch.Tensor, what: str) -> torch.Tensor:
    """A flat int64 CPU tensor (a device tensor is copied, which waits for the device: pass CPU copies)."""
    if lengths.dtype == torch.int64 and lengths.dim() == 1 and lengths.device.type == "cpu":
        return lengths
    if lengths.dtype == torch.bool or lengths.is_floating_point():
        raise ValueError(f"{what} must be an integer tensor, got dtype {lengths.dtype}")
    return lengths.reshape(-1).to(device="cpu", dtype=torch.int64)


def new_pages_for_extend(prefix_lens: Any, seq_lens: Any, page_size: int) -> Any:
    """Fresh pages each request needs to grow from prefix_lens to seq_lens tokens (ints or tensors)."""
    return ceil_div(seq_lens, page_size) - ceil_div(prefix_lens, page_size)


SMALL_BATCH = 64  # up to this many requests, Python ints beat torch ops on the host


def check_extend_totals(tokens: int, min_prefix: int, min_length: int, extend_num_tokens: int) -> None:
    """Raise ValueError on an inconsistent batch, given its totals (0s for an empty batch)."""
    if min_prefix < 0:
        raise ValueError(f"prefix_lens must be >= 0, got {min_prefix}")
    if min_length < 0:
        raise ValueError(f"seq_lens must be >= prefix_lens; one request has seq_lens - prefix_lens = {min_length}")
    if tokens != extend_num_tokens:
        raise ValueError(f"extend_num_tokens is {extend_num_tokens} but sum(seq_lens - prefix_lens) is {tokens}")


def check_extend_lengths(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, extend_num_tokens: int) -> int:
    """Raise ValueError on an inconsistent batch; the number of new tokens otherwise."""
    if prefix_lens.numel() != seq_lens.numel():
        raise ValueError(f"prefix_lens has {prefix_lens.numel()} requests but seq_lens has {seq_lens.numel()}")
    if not prefix_lens.numel():
        check_extend_totals(0, 0, 0, extend_num_tokens)
        return 0
    lengths = seq_lens - prefix_lens
    tokens = int(lengths.sum())
    check_extend_totals(tokens, int(prefix_lens.min()), int(lengths.min()), extend_num_tokens)
    return tokens


def count_extend_pages(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int, extend_num_tokens: int) -> int:
    """Fresh pages a valid batch takes (ValueError on an inconsistent one), from the CPU lengths."""
    if prefix_lens.numel() != seq_lens.numel():
        raise ValueError(f"prefix_lens has {prefix_lens.numel()} requests but seq_lens has {seq_lens.numel()}")
    if prefix_lens.numel() > SMALL_BATCH:
        check_extend_lengths(prefix_lens, seq_lens, extend_num_tokens)
        return int(new_pages_for_extend(prefix_lens, seq_lens, page_size).sum())
    prefix, seq = prefix_lens.tolist(), seq_lens.tolist()
    lengths = [b - a for a, b in zip(prefix, seq)]
    check_extend_totals(sum(lengths), min(prefix, default=0), min(lengths, default=0), extend_num_tokens)
    return sum(new_pages_for_extend(a, b, page_size) for a, b in zip(prefix, seq))


@dataclass(frozen=True, slots=True)
class ExtendSplit:
    """A small batch's new tokens as runs, from host ints: request r first continues its partial page
    (k_r tokens after last_loc[r]), then fills its fresh pages in order (ft_r tokens). The device makes
    one row of page_size candidates per request (last_loc + 1 + i) and per fresh page (start + i); split
    by these sizes, the even pieces interleaved are the output, so nothing is planned per token."""

    num_new_pages: int
    num_tokens: int
    continues_a_page: bool
    partial_sizes: list[int]  # [k_0, P - k_0, k_1, P - k_1, ...] over the batch's continuation rows
    fresh_sizes: list[int]  # [ft_0, f_0 * P - ft_0, ...] over the fresh pages' rows


def split_extend(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int, extend_num_tokens: int) -> ExtendSplit:
    """The runs of a valid batch of CPU int64 lengths (ValueError on an inconsistent one); for SMALL_BATCH requests."""
    if prefix_lens.numel() != seq_lens.numel():
        raise ValueError(f"prefix_lens has {prefix_lens.numel()} requests but seq_lens has {seq_lens.numel()}")
    prefix, seq = prefix_lens.tolist(), seq_lens.tolist()
    lengths = [b - a for a, b in zip(prefix, seq)]
    check_extend_totals(sum(lengths), min(prefix, default=0), min(lengths, default=0), extend_num_tokens)
    partial, fresh, pages = [], [], 0
    for a, b, length in zip(prefix, seq, lengths):
        room = -a % page_size  # free rows left on the page position a - 1 is on
        k = min(length, room)
        f = new_pages_for_extend(a, b, page_size)
        partial += (k, page_size - k)
        fresh += (length - k, f * page_size - length + k)
        pages += f
    return ExtendSplit(pages, extend_num_tokens, any(partial[::2]), partial, fresh)


def count_decode_pages(seq_lens: torch.Tensor, page_size: int) -> int:
    """Fresh pages a decode batch takes: the requests whose new token starts a page (CPU lengths)."""
    return int(torch.count_nonzero(decode_starts_page(seq_lens, page_size)))


def request_of_each_token(ends: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Which request each of num_tokens tokens belongs to, given each request's cumulative end.

    A +1 at every request's first token, summed: (torch.repeat_interleave and
    torch.searchsorted take milliseconds for this on a busy multi-threaded CPU).
    """
    marks = torch.zeros(num_tokens + 1, dtype=torch.int64)
    marks.index_add_(0, ends[:-1], torch.ones(ends.numel() - 1, dtype=torch.int64))
    return torch.cumsum(marks[:num_tokens], 0)


def plan_extend(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int, num_tokens: int) -> ExtendPlan:
    """The plan for CPU int64 lengths; num_tokens must be sum(seq_lens - prefix_lens)."""
    batch = prefix_lens.numel()
    fresh = new_pages_for_extend(prefix_lens, seq_lens, page_size)
    num_new_pages = int(fresh.sum()) if batch else 0
    lengths = seq_lens - prefix_lens
    offset_in_page = prefix_lens % page_size
    continues = bool(torch.mul(offset_in_page, lengths).any()) if batch else False  # lengths >= 0
    ends = torch.cumsum(lengths, 0)
    fresh_ends = torch.cumsum(fresh, 0)
    partial_slot = torch.arange(batch) + (fresh_ends - fresh)  # each request: 1 slot, then its fresh pages
    packed = torch.empty(2 * batch + num_new_pages + 2 * num_tokens, dtype=torch.int64)
    slots, shift, fresh_slots, gather, offset = torch.split(packed, (batch, batch, num_new_pages, num_tokens, num_tokens))
    slots.copy_(partial_slot)
    torch.sub(1, offset_in_page, out=shift)
    if num_new_pages:
        torch.add(torch.arange(1, num_new_pages + 1), request_of_each_token(fresh_ends, num_new_pages), out=fresh_slots)
    if num_tokens:
        req = request_of_each_token(ends, num_tokens)
        pos = torch.arange(num_tokens).add_(torch.index_select(prefix_lens - (ends - lengths), 0, req))
        page = torch.div(pos, page_size, rounding_mode="floor")
        # position pos is on page `page`; the request's partial page is ceil(prefix / P) - 1, at its slot
        torch.add(page, torch.index_select(partial_slot + 1 - ceil_div(prefix_lens, page_size), 0, req), out=gather)
        torch.sub(pos, page.mul_(page_size), out=offset)
    return ExtendPlan(num_new_pages, num_tokens, batch, continues, packed)


def decode_starts_page(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Which requests' new token (position seq_lens-1) is the first of a page: (seq_lens-1) % page_size == 0."""
    return seq_lens % page_size == 1 % page_size


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on device without a host sync: through pinned memory and a non-blocking copy."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """One alloc_decode, counted on the host: shared by both sides of an SWA allocator."""

    num_new_pages: int
    seq_lens: torch.Tensor  # as passed (the device kernel reads it)
    starting: torch.Tensor | None  # CPU positions of the requests that start a page (host path only)


@dataclass(frozen=True, slots=True)
class ExtendBatch:
    """One alloc_extend, counted (and, on the host path, planned) on the host."""

    num_new_pages: int
    num_tokens: int
    prefix_lens: torch.Tensor  # as passed (the device kernel reads them)
    seq_lens: torch.Tensor
    plan: ExtendPlan | None  # host path, larger batches
    split: ExtendSplit | None = None  # host path, up to SMALL_BATCH requests
