"""Allocators: which KV token indices are free. Token-level, paged, and SWA-paired (SGLang 0.5.23's API).

alloc and free cost O(indices in the call), never O(pool), and sync the host only in
set-shaped paged frees: see free_log.FreeLog and paged.
"""

from kvcache.allocators.base import AllocatorState
from kvcache.allocators.eviction import EvictParams
from kvcache.allocators.paged import PagedTokenToKVPoolAllocator
from kvcache.allocators.swa import SWAAllocatorState, SWATokenToKVPoolAllocator
from kvcache.allocators.token import TokenToKVPoolAllocator

__all__ = [
    "AllocatorState",
    "EvictParams",
    "PagedTokenToKVPoolAllocator",
    "SWAAllocatorState",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
]
