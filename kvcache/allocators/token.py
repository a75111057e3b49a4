"""TokenToKVPoolAllocator: KV token indices 1..size, one token at a time (page_size 1).

Index 0 is the KV pool's padding row and is never handed out. alloc and free cost
O(n) whatever the pool size (see kvcache.allocators.free_stack).
"""

from __future__ import annotations

import torch

from kvcache.allocators.base import FreeListAllocator, check_need_size, reject_meta


class TokenToKVPoolAllocator(FreeListAllocator):
    """SGLang's token allocator API; `size` usable tokens, indices are int64 on `device`."""

    def __init__(self, *, size: int, device: torch.device | str, check_frees: bool = False) -> None:
        if size < 1:
            raise ValueError(f"size must be a positive number of tokens, got {size}")
        super().__init__(capacity=size, page_size=1, device=device, check_frees=check_frees, unit="token index")

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size free token indices, or None (allocating nothing) when fewer are free."""
        check_need_size(need_size, 1)
        reject_meta(self._device, "alloc")
        return self._stack.pop(need_size)

    def _release(self, indices: torch.Tensor) -> None:
        self._stack.push(indices)
