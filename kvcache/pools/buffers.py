"""The one place pools get device memory from, and how their bytes are counted.

Every pool allocates through `allocate_zeros`, so a test can make the N-th allocation
fail and check that a part-built pool leaves nothing behind.
"""

from __future__ import annotations

from typing import Iterable

import torch


def allocate_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-initialised buffer (on `meta`, a shape with no memory behind it)."""
    return torch.zeros(shape, dtype=dtype, device=device)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes of these tensors (numel * element size), on any device, meta included."""
    return sum(t.numel() * t.element_size() for t in tensors)
