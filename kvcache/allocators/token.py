"""TokenToKVPoolAllocator: hands out KV token indices 1..size one token at a time (page_size 1).

Index 0 is the pool's padding row and is never handed out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache.allocators.free_stack import FreeStack, FreeStackState


@dataclass(frozen=True, slots=True)
class TokenAllocatorState:
    free_list: FreeStackState


class TokenToKVPoolAllocator:
    """SGLang's allocator API over a FreeStack of token indices."""

    def __init__(self, *, size: int, device: torch.device, check_frees: bool = False) -> None:
        self._free = FreeStack(capacity=size, device=device, check=check_frees)
        self._device = device
        self._group: list[torch.Tensor] | None = None

    size = property(lambda self: self._free.capacity)
    page_size = property(lambda self: 1)
    device = property(lambda self: self._device)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self._free.pop(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self._group is not None:
            self._group.append(free_index)
        else:
            self._free.push(free_index)

    def free_group_begin(self) -> None:
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self._free.push(torch.cat(group))

    def available_size(self) -> int:
        return self._free.available

    def clear(self) -> None:
        self._group = None
        self._free.reset()

    def backup_state(self) -> TokenAllocatorState:
        return TokenAllocatorState(self._free.backup())

    def restore_state(self, state: TokenAllocatorState) -> None:
        self._free.restore(state.free_list)

    @property
    def nbytes(self) -> int:
        """Device bytes of the free list (kvcache.allocators.footprint states the formula)."""
        return self._free.nbytes
