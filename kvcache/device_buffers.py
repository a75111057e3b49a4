"""The one place the engine gets device memory from, and how its bytes are counted.

Every buffer is allocated at `allocation_size(nbytes)`: up to 1 MiB in 512-byte
blocks (PyTorch's CUDA caching allocator's small pool), above that in 2 MiB multiples.
The allocator hands a large block out whole, unsplit, when what would be left over is
1 MiB or less; with every large buffer a 2 MiB multiple, the leftover is 0 or at least
2 MiB, so the planned bytes equal torch.cuda.memory_allocated's growth exactly
(measured on an H200: benchmarks/RESULTS.md). The tensor is a
view of the first nbytes. Tests make the N-th allocation fail through this module.
"""

from __future__ import annotations

import mmap
from math import prod
from itertools import accumulate
from typing import Iterable, Sequence

import torch

from kvcache.byte_units import MiB

BLOCK_ROUND = 512
LARGE_ROUND = 2 * MiB
SMALL_UP_TO = 1 * MiB
HOST_MAP_THRESHOLD = 1 * MiB


def allocation_size(nbytes: int) -> int:
    """Bytes a buffer of `nbytes` really occupies (the formula every plan uses)."""
    if nbytes <= 0:
        return 0
    rounded = -(-nbytes // BLOCK_ROUND) * BLOCK_ROUND
    return -(-rounded // LARGE_ROUND) * LARGE_ROUND if rounded > SMALL_UP_TO else rounded


def allocate_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-initialised buffer of `shape` (on `meta`, a shape with no memory behind it).

    Large host buffers come from an anonymous mapping, whose pages the kernel hands out
    already zeroed when first touched: a multi-GiB CPU pool builds in microseconds
    instead of a memset that faults in every page.
    """
    nbytes = prod(shape) * dtype.itemsize
    size = allocation_size(nbytes)
    if size == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    if device.type == "cpu" and size >= HOST_MAP_THRESHOLD:
        flat = torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)
    else:
        flat = torch.zeros(size, dtype=torch.uint8, device=device)
    return flat[:nbytes].view(dtype).view(shape)


def carve(segments: Sequence[tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """One zeroed allocation holding every segment back to back, returned as one tensor per segment.

    A pool takes all its layers' buffers in one allocation, so the allocator's rounding
    costs it at most one block, and one failure leaves nothing half-built.
    """
    sizes = [prod(shape) * dtype.itemsize for shape, dtype in segments]
    for (_, dtype), offset in zip(segments, accumulate([0, *sizes])):
        if offset % dtype.itemsize:
            raise ValueError(f"segment at byte {offset} is not aligned for {dtype}")
    flat = allocate_zeros((sum(sizes),), torch.uint8, device)
    out: list[torch.Tensor] = []
    offset = 0
    for (shape, dtype), size in zip(segments, sizes):
        out.append(flat[offset:offset + size].view(dtype).view(shape))
        offset += size
    return out


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes behind these tensors: each distinct storage once, rounding included, on any device."""
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}  # views share one
    return sum(storages.values())
