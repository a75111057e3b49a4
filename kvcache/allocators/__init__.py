"""Allocators: which KV token indices are free. Token-level, paged, and SWA-paired (SGLang's API).

alloc and free cost O(indices in the call), never O(pool): see free_stack.FreeStack.
"""

from kvcache.allocators.base import AllocatorState
from kvcache.allocators.footprint import allocator_index_bytes
from kvcache.allocators.paged import PagedTokenToKVPoolAllocator
from kvcache.allocators.swa import SWAAllocatorState, SWATokenToKVPoolAllocator
from kvcache.allocators.token import TokenToKVPoolAllocator

__all__ = [
    "AllocatorState",
    "PagedTokenToKVPoolAllocator",
    "SWAAllocatorState",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "allocator_index_bytes",
]
