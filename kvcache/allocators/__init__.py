"""Allocators: which KV token indices are free. Token-level, paged, and SWA-paired."""

from kvcache.allocators.footprint import allocator_index_bytes
from kvcache.allocators.paged import PagedTokenToKVPoolAllocator
from kvcache.allocators.swa import SWATokenToKVPoolAllocator
from kvcache.allocators.token import TokenToKVPoolAllocator

__all__ = ["PagedTokenToKVPoolAllocator", "SWATokenToKVPoolAllocator", "TokenToKVPoolAllocator", "allocator_index_bytes"]
