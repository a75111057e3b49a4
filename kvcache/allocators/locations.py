"""Where each new token of a batch goes in a paged pool: pure, vectorised torch (no per-token loop).

A request at positions prefix..seq-1 first fills its partial last page (continuing
from last_loc, the index of position prefix-1), then takes its share of the fresh
pages, in request order. Page p holds token indices p*page_size .. p*page_size+page_size-1.
"""

from __future__ import annotations

import torch


def ceil_div(a: torch.Tensor, b: int) -> torch.Tensor:
    return (a + b - 1) // b


def extend_pages(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Fresh pages each request needs to grow from prefix_lens to seq_lens tokens."""
    return ceil_div(seq_lens, page_size) - ceil_div(prefix_lens, page_size)


def extend_locations(
    *, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor,
    new_pages: torch.Tensor, page_size: int, num_tokens: int,
) -> torch.Tensor:
    """Token indices for positions prefix_lens[i]..seq_lens[i]-1 of every request, flat, in request order.

    new_pages holds exactly sum(extend_pages(...)) pages; num_tokens is sum(seq_lens - prefix_lens).
    """
    device = prefix_lens.device
    lengths = seq_lens - prefix_lens
    req = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths, output_size=num_tokens)
    starts = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(num_tokens, device=device) - starts[req]  # 0.. within the request
    pos = prefix_lens[req] + offset
    continued = last_loc[req] + offset + 1
    if new_pages.numel() == 0:
        return continued
    kept = ceil_div(prefix_lens, page_size)  # pages the request already has, partial last one included
    fresh_per_req = ceil_div(seq_lens, page_size) - kept
    first_fresh = torch.cumsum(fresh_per_req, 0) - fresh_per_req
    slot = (first_fresh[req] + pos // page_size - kept[req]).clamp_(0, new_pages.numel() - 1)
    fresh = new_pages[slot] * page_size + pos % page_size
    return torch.where(pos < kept[req] * page_size, continued, fresh)


def decode_starts_page(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Which requests' new token (position seq_lens-1) is the first of a page: (seq_lens-1) % page_size == 0."""
    return seq_lens % page_size == 1 % page_size


def decode_locations(
    *, starts_page: torch.Tensor, last_loc: torch.Tensor, new_pages: torch.Tensor, page_size: int,
) -> torch.Tensor:
    """One token index per request: the start of its next fresh page where starts_page, else last_loc + 1."""
    out = last_loc + 1
    if new_pages.numel() == 0:
        return out
    return out.masked_scatter(starts_page, new_pages * page_size)
