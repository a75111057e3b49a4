"""The one place pools get device memory from, and how their bytes are counted.

Every pool allocates through `allocate_zeros`, so a test can make the N-th allocation
fail and check that a part-built pool leaves nothing behind.
"""

from __future__ import annotations

import mmap
from math import prod
from typing import Iterable

import torch


HOST_MAP_THRESHOLD = 1 << 20


def allocate_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-initialised buffer (on `meta`, a shape with no memory behind it).

    Large host buffers come from an anonymous mapping, whose pages the kernel hands
    out already zeroed when first touched: a multi-GiB CPU pool builds in microseconds
    instead of a memset that faults in every page.
    """
    nbytes = prod(shape) * dtype.itemsize
    if device.type == "cpu" and nbytes >= HOST_MAP_THRESHOLD:
        return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)
    return torch.zeros(shape, dtype=dtype, device=device)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes of these tensors (numel * element size), on any device, meta included."""
    return sum(t.numel() * t.element_size() for t in tensors)
