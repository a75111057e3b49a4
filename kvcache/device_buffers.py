"""The one place the engine gets device memory from, and how its bytes are counted.

Every buffer is allocated at `allocation_size(nbytes)`: rounded the way PyTorch's
CUDA caching allocator counts a fresh block (512-byte multiples; 2 MiB multiples
from 10 MiB up, where it would otherwise keep an unsplit segment tail), so the
planned bytes equal torch.cuda.memory_allocated's growth exactly. The tensor is a
view of the first nbytes. Tests make the N-th allocation fail through this module.
"""

from __future__ import annotations

import mmap
from math import prod
from typing import Iterable

import torch

from kvcache.byte_units import MiB

BLOCK_ROUND = 512
LARGE_ROUND = 2 * MiB
LARGE_FROM = 10 * MiB
HOST_MAP_THRESHOLD = 1 * MiB


def allocation_size(nbytes: int) -> int:
    """Bytes a buffer of `nbytes` really occupies (the formula every plan uses)."""
    if nbytes <= 0:
        return 0
    rounded = -(-nbytes // BLOCK_ROUND) * BLOCK_ROUND
    return -(-rounded // LARGE_ROUND) * LARGE_ROUND if rounded >= LARGE_FROM else rounded


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


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes behind these tensors (their storages, rounding included), on any device."""
    return sum(t.untyped_storage().nbytes() for t in tensors)
