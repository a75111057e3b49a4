"""Allocators built alone (tests, benchmarks): their part of a plan for a token count, planned as the plan plans it.

An allocator reads its sizes from its planned slots (kvcache.sizing.allocator_footprint); these build those slots
from token counts, refusing counts that are not whole pages (a plan's never are), and carve them from an arena of
the allocator's own unless `views` are given.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from kvcache.allocators import PagedTokenToKVPoolAllocator, SWATokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvcache.allocators.given import checked_page_size
from kvcache.allocators.paged_kernels import PagedKernels
from kvcache.pools.planned_views import Views
from kvcache.sizing.allocator_footprint import allocator_slots, free_list_slots


def whole_pages(what: str, tokens: int, page_size: int) -> int:
    """`tokens`, or ValueError unless they are a positive multiple of page_size (itself at least 1)."""
    if tokens < checked_page_size(page_size) or tokens % page_size:
        raise ValueError(f"{what} {tokens} must be a positive multiple of page_size {page_size}")
    return tokens


def token_allocator(*, size: int, device: torch.device | str = "cpu", check_frees: bool = False,
                    kvcache: Any = None, views: Views | None = None) -> TokenToKVPoolAllocator:
    """A page-size-1 allocator of `size` tokens: the free list the plan lists for them."""
    slots = free_list_slots(whole_pages("size", size, 1), 1, check_frees)
    return TokenToKVPoolAllocator(slots=slots, device=device, kvcache=kvcache, views=views)


def paged_allocator(*, size: int, page_size: int, device: torch.device | str = "cpu", check_frees: bool = False,
                    kvcache: Any = None, kernels: PagedKernels | None | Literal["auto"] = "auto",
                    views: Views | None = None) -> PagedTokenToKVPoolAllocator:
    """A paged allocator of `size` tokens in pages of page_size: the free list the plan lists for them."""
    slots = free_list_slots(whole_pages("size", size, page_size), page_size, check_frees)
    return PagedTokenToKVPoolAllocator(slots=slots, page_size=page_size, device=device, kvcache=kvcache,
                                       kernels=kernels, views=views)


def swa_allocator(*, full_size: int, swa_size: int, page_size: int, device: torch.device | str = "cpu",
                  check_frees: bool = False, kvcache: Any = None, views: Views | None = None) -> SWATokenToKVPoolAllocator:
    """An SWA pair of full_size and swa_size tokens: both free lists and the map the plan lists for them."""
    slots = allocator_slots(whole_pages("full_size", full_size, page_size), page_size,
                            whole_pages("swa_size", swa_size, page_size), check_frees=check_frees)
    return SWATokenToKVPoolAllocator(slots=slots, page_size=page_size, device=device, kvcache=kvcache, views=views)
