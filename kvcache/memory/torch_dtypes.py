"""Where a plan's dtypes meet torch: a `DType` (kvcache.inputs.dtypes) as the `torch.dtype` tensors are made in.

Planning states element types as names and sizes and imports no torch; the pool builder, the weight
loader and the forward turn them into torch's here, and read a built tensor's dtype back as the plan's name.
"""

from __future__ import annotations

import torch

from kvcache.inputs.dtypes import DType


def torch_dtype(dtype: DType | str) -> torch.dtype:
    """torch.bfloat16 for DType("bfloat16", 2) or for 'bfloat16' (a planned tensor's dtype name)."""
    name = dtype if isinstance(dtype, str) else dtype.name
    found = getattr(torch, name)
    assert isinstance(found, torch.dtype), name
    return found


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: the name a plan gives it (the attribute of `torch` that names it)."""
    return str(dtype).removeprefix("torch.")
