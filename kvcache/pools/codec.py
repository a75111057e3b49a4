"""How cached values are written into a pool's storage: cast, FP8 as bytes, FP4 with scales.

FP4 (e2m1) packs two values per byte; each group of 16 values shares one scale byte,
stored as an FP8 e4m3 bit pattern (amax / 6, 6 being e2m1's largest magnitude).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from kvcache.inputs.dtypes import KVCacheDtype
from kvcache.memory.torch_dtypes import torch_dtype

_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP4_GROUP = 16


def encode(values: torch.Tensor, dtype: KVCacheDtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Values in model dtype -> (data in storage dtype, scales or None)."""
    if dtype.scale_group:
        return quantize_fp4(values)
    if dtype.stored_as_bytes:
        return values.to(torch_dtype(dtype.element_dtype)).view(torch.uint8), None
    return values.to(torch_dtype(dtype.storage_dtype)), None


def decode_view(storage: torch.Tensor, dtype: KVCacheDtype) -> torch.Tensor:
    """The buffer as kernels read it: FP8 bytes viewed as FP8; other formats as stored."""
    if dtype.stored_as_bytes and not dtype.scale_group:
        return storage.view(torch_dtype(dtype.element_dtype))
    return storage


def quantize_fp4(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., d] floats (d a multiple of 16) -> packed [..., d/2] uint8 and [..., d/16] scale bytes."""
    x = values.float()
    groups = x.reshape(*x.shape[:-1], -1, FP4_GROUP)
    scale = (groups.abs().amax(dim=-1, keepdim=True) / 6.0).to(torch.float8_e4m3fn)
    safe = scale.float().where(scale.float() > 0, torch.ones_like(scale.float()))
    scaled = (groups / safe).clamp(-6.0, 6.0)
    table = _E2M1_VALUES.to(x.device)
    codes = (scaled.abs().unsqueeze(-1) - table).abs().argmin(dim=-1).to(torch.uint8)
    codes = codes | ((scaled < 0).to(torch.uint8) << 3)
    codes = codes.reshape(*x.shape[:-1], -1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scale.squeeze(-1).view(torch.uint8)


def dequantize_fp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_fp4, to float32 (for tests and reference kernels)."""
    low, high = packed & 0x0F, packed >> 4
    codes = torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], -1)
    table = _E2M1_VALUES.to(packed.device)
    magnitude = table[(codes & 0x7).long()]
    signed = torch.where((codes & 0x8) > 0, -magnitude, magnitude)
    scale = scales.view(torch.float8_e4m3fn).float().repeat_interleave(FP4_GROUP, dim=-1)
    return signed * scale


class CacheTensor:
    """One logical [rows, heads, dim] cache tensor in a KV dtype: data, plus scales for FP4."""

    __slots__ = ("data", "scales", "dtype")

    def __init__(self, parts: list[torch.Tensor], dtype: KVCacheDtype) -> None:
        self.dtype = dtype
        self.data = parts[0]
        self.scales = parts[1] if dtype.scale_group else None

    @staticmethod
    def take(parts: list[torch.Tensor], dtype: KVCacheDtype) -> "CacheTensor":
        """Build from the front of `parts` (the views of kvcache.sizing.layer_specs.cache_row's tensors), consuming them."""
        n = 2 if dtype.scale_group else 1
        taken = [parts.pop(0) for _ in range(n)]
        return CacheTensor(taken, dtype)

    def write(self, loc: torch.Tensor, values: torch.Tensor) -> None:
        """Store `values` ([n, heads, dim], model dtype) at rows `loc`."""
        data, scales = encode(values, self.dtype)
        self.data[loc] = data
        if self.scales is not None:
            self.scales[loc] = scales

    def read(self) -> torch.Tensor:
        return decode_view(self.data, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of its data and scales."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales) if t is not None)


class LayerIndex:
    """Global layer ids -> positions in a pool's per-layer lists, with an error naming the pool's range."""

    __slots__ = ("layer_ids", "_position")

    def __init__(self, layer_ids: "Sequence[int]") -> None:
        self.layer_ids = tuple(layer_ids)
        self._position = {layer: i for i, layer in enumerate(self.layer_ids)}

    def __call__(self, layer: "int | Any") -> int:
        """Position of a layer given by number or, as SGLang 0.5.23 passes it, by an object with `.layer_id`."""
        layer_id = layer if isinstance(layer, int) else layer.layer_id
        try:
            return self._position[layer_id]
        except KeyError:
            span = f"{self.layer_ids[0]}..{self.layer_ids[-1]}" if self.layer_ids else "none"
            raise KeyError(f"layer {layer_id} is not in this pool (layers {span})") from None

    def __len__(self) -> int:
        return len(self.layer_ids)
