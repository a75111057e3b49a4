"""The one place the engine gets device memory from, and how its bytes are counted.

A worker's KV cache (pools, request table, allocator lists, state) is carved from ONE
`Arena`: each buffer a slot of `slot_size(nbytes)` (512-byte aligned, packed back to
back) in a single allocation of `arena_size(slots)` bytes, a 2 MiB multiple of at least
10 MiB. Dummy weights come from an arena of their own. The CUDA caching allocator serves a request of 10 MiB or more from a segment of
exactly that size (smaller ones share 2 MiB or 20 MiB segments), so the arena lowers
cudaMemGetInfo's free bytes by exactly its size, not only torch.cuda.memory_allocated.
The arena is passed explicitly to what carves it; pools and allocators are handed views of
it (kvcache.pools.planned_views) and allocate nothing themselves. One allocation on its own
takes `allocation_size(nbytes)`, what the caching allocator gives it: 512-byte blocks up to
1 MiB, 2 MiB multiples above. Tests make the N-th arena or slot fail through this module.
"""

from __future__ import annotations

import mmap
from math import prod
from itertools import accumulate
from typing import Protocol, Sequence

import torch

from kvcache.errors import PlanMismatchError
from kvcache.sizing.arena_sizes import HOST_MAP_THRESHOLD, slot_size


class ArenaBacking(Protocol):
    """Where an arena's bytes come from instead of the device's allocator (kvcache.memory.vmm_storage.VmmBacking
    backs the CUDA pools that a live resize trims and grows)."""

    def __call__(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """`nbytes` as one flat uint8 tensor on `device`."""
        ...

    def mapped_bytes(self, flat: torch.Tensor) -> int:
        """Bytes backed by device memory now of the allocation holding `flat` (one this backing made)."""
        ...


def _flat(size: int, device: torch.device, *, zeroed: bool) -> torch.Tensor:
    """`size` bytes in one allocation. Large host buffers come from an anonymous mapping, whose
    pages the kernel hands out already zeroed when first touched (no memset faulting in every page)."""
    if device.type == "cpu" and size >= HOST_MAP_THRESHOLD:
        return torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)
    if zeroed:
        return torch.zeros(size, dtype=torch.uint8, device=device)
    return torch.empty(size, dtype=torch.uint8, device=device)


class Arena:
    """One allocation that buffers are carved from back to back, each in a slot of `slot_size(n)` bytes.

    It is passed to whoever carves it (kvcache.pools.planned_views for the KV pools, the weight loader):
    nothing allocates from an arena it was not handed. Given a `backing`, it takes its bytes from it (VMM
    storage for a CUDA worker whose pools a post-capture resize trims) instead of the device's allocator."""

    def __init__(self, nbytes: int, device: torch.device, *,
                 zeroed: bool = True, backing: ArenaBacking | None = None) -> None:
        self.nbytes = nbytes
        self.device = device
        self._backing = backing
        if backing is not None:
            flat = backing(nbytes, device)
            self._flat = flat.zero_() if zeroed else flat
        else:
            self._flat = _flat(nbytes, device, zeroed=zeroed)
        self.used = 0  # bytes of the slots handed out so far

    @property
    def mapped_bytes(self) -> int:
        """Bytes of it backed by device memory now: `nbytes` (its size as made), unless its backing has unmapped or
        mapped again some since (VMM storage whose KV tails a live resize released: kvcache.runtime.live_resize)."""
        return self.nbytes if self._backing is None else self._backing.mapped_bytes(self._flat)

    def _slot(self, nbytes: int, device: torch.device) -> int:
        """Start of the next slot of slot_size(nbytes) bytes, taken; PlanMismatchError when it does not fit."""
        if torch.device(device) != self.device:
            raise PlanMismatchError(f"a buffer for {device} was asked of the arena on {self.device}")
        start, size = self.used, slot_size(nbytes)
        if start + size > self.nbytes:
            raise PlanMismatchError(
                f"a {nbytes:,} B buffer does not fit in the KV arena: {start:,} of {self.nbytes:,} B are taken; "
                "something allocates more than the plan lists"
            )
        self.used = start + size
        return start

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The next slot, viewed as `shape`; PlanMismatchError when the arena has no room left for it."""
        nbytes = prod(shape) * dtype.itemsize
        start = self._slot(nbytes, device)
        return self._flat[start:start + nbytes].view(dtype).view(shape)

    def carve_slot(self, parts: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor]:
        """The next slot holding `parts` back to back, one view per part (a pool's layers, one allocator list)."""
        sizes = [prod(shape) * dtype.itemsize for shape, dtype in parts]
        for (shape, dtype), offset in zip(parts, accumulate([0, *sizes])):
            if offset % dtype.itemsize:
                raise ValueError(f"a {dtype} tensor {shape} would start at byte {offset} of its slot, not aligned")
        start = self._slot(sum(sizes), self.device)
        return [self._flat[offset:offset + size].view(dtype).view(shape)
                for (shape, dtype), size, offset in zip(parts, sizes, accumulate(sizes, initial=start))]
