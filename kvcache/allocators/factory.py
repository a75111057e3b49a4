"""allocator_for_plan: the one rule that picks a plan's token allocator (an AllocatorFactory).

SWA-paired when the plan pairs a sliding-window pool with a full pool (MemoryPoolConfig.paired_window_pool:
the one place hybrid-ness is decided; the pool builder asks the same plan for its hybrid pool);
otherwise token-level at page_size 1 and paged above, as SGLang 0.5.23 chooses. The allocator is given the
plan's allocator slots and reads its sizes from them; its buffers are the builder's views of those slots (or,
given none, as for the fresh allocator of a resize, carved from an arena of its own).
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.allocators import PagedTokenToKVPoolAllocator, SWATokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvcache.pools.allocator_protocol import TokenAllocator
from kvcache.pools.planned_views import Views
from kvcache.sizing.pool_config import MemoryPoolConfig


def allocator_for_plan(*, plan: MemoryPoolConfig, device: torch.device, kvcache: Any = None,
                       views: Views | None = None, check_frees: bool = False) -> TokenAllocator:
    """The allocator over the plan's token rows: SWA-paired, token-level or paged, given the plan's allocator slots
    (MemoryPoolConfig.allocator_slots, with is_free flags when `check_frees`: a resize asks for what the
    allocator it replaces did), from which it reads its sizes; `kvcache` is the KV pool its indices address (what
    get_kvcache() returns); `views` the builder's carve of the plan's tensors (None: it carves its own)."""
    slots = plan.allocator_slots(check_frees=check_frees)
    if plan.paired_window_pool is not None:
        return SWATokenToKVPoolAllocator(slots=slots, page_size=plan.page_size, device=device, kvcache=kvcache,
                                         views=views)
    if plan.page_size == 1:
        return TokenToKVPoolAllocator(slots=slots, device=device, kvcache=kvcache, views=views)
    return PagedTokenToKVPoolAllocator(slots=slots, page_size=plan.page_size, device=device, kvcache=kvcache,
                                       views=views)
