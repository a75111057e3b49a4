"""DummyWeightLoader: real-size random weights on the device, as SGLang and vLLM profile without a checkpoint.

Quantized checkpoints keep their narrow storage: `fp8` stores linear and expert
weights as one byte per element plus a float32 scale per 128 x 128 block; `mxfp4`
(gpt-oss) stores experts as half a byte per element plus one scale byte per 32.
`storage_of` is the one formula for a tensor's storage, used for the up-front
byte count and for the allocation alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Literal, Mapping, Sequence

import torch

from app.weights.shapes import ParamSpec
from kvcache.byte_units import format_bytes

QuantizedStorage = Literal["fp8", "mxfp4"] | None
FP8_BLOCK = 128
MXFP4_GROUP = 32


class WeightsDoNotFitError(ValueError):
    """Allocating the weights ran out of memory; what was allocated has been freed."""

    def __init__(self, *, needed_bytes: int, allocated_bytes: int, device: torch.device) -> None:
        self.needed_bytes = needed_bytes
        self.allocated_bytes = allocated_bytes
        super().__init__(
            f"dummy weights need {format_bytes(needed_bytes)} on {device}; allocation failed after "
            f"{format_bytes(allocated_bytes)} (freed). Use a larger --tp-size"
        )


def quantized_storage_for(hf_config: Mapping[str, Any]) -> QuantizedStorage:
    """The narrow storage a checkpoint's quantization_config implies (None for unquantized)."""
    method = (hf_config.get("quantization_config") or {}).get("quant_method")
    return method if method in ("fp8", "mxfp4") else None


def storage_of(spec: ParamSpec, dtype: torch.dtype, quantized: QuantizedStorage) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The tensors (suffix, shape, dtype) that hold one parameter."""
    if quantized == "fp8" and spec.kind in ("linear", "expert") and len(spec.shape) >= 2:
        *lead, rows, cols = spec.shape
        scales = (*lead, -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        return [("", spec.shape, torch.uint8), ("_scale_inv", scales, torch.float32)]
    if quantized == "mxfp4" and spec.kind == "expert" and spec.shape[-1] % MXFP4_GROUP == 0:
        *lead, cols = spec.shape
        return [("_blocks", (*lead, cols // 2), torch.uint8), ("_scales", (*lead, cols // MXFP4_GROUP), torch.uint8)]
    return [("", spec.shape, dtype)]


def bytes_needed(specs: Sequence[ParamSpec], dtype: torch.dtype, quantized: QuantizedStorage) -> int:
    return sum(prod(shape) * dt.itemsize for s in specs for _, shape, dt in storage_of(s, dtype, quantized))


@dataclass(frozen=True, slots=True)
class LoadedWeights:
    """The allocated tensors and their exact bytes."""

    tensors: dict[str, torch.Tensor]
    total_bytes: int
    parameter_count: int


def _allocate(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


NOISE_ELEMENTS = 1 << 20


def _noise(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One block of random values; large tensors repeat it (dummy weights need size, not entropy)."""
    block = torch.empty(NOISE_ELEMENTS, dtype=dtype, device=device)
    return block.random_(0, 256) if dtype == torch.uint8 else block.uniform_(-1e-3, 1e-3)


def _fill_random(t: torch.Tensor, noise: dict[tuple[torch.dtype, torch.device], torch.Tensor]) -> None:
    if t.device.type == "meta" or t.numel() == 0:
        return
    key = (t.dtype, t.device)
    if key not in noise:
        noise[key] = _noise(t.dtype, t.device)
    flat, block = t.view(-1), noise[key]
    for start in range(0, flat.numel(), NOISE_ELEMENTS):
        end = min(start + NOISE_ELEMENTS, flat.numel())
        flat[start:end].copy_(block[: end - start])


@dataclass(frozen=True, slots=True, kw_only=True)
class DummyWeightLoader:
    """Allocates every parameter on `device` in `dtype` (or its quantized storage) and fills it with noise."""

    device: torch.device
    dtype: torch.dtype
    quantized_storage: QuantizedStorage = None

    def bytes_needed(self, specs: Sequence[ParamSpec]) -> int:
        return bytes_needed(specs, self.dtype, self.quantized_storage)

    def load(self, specs: Sequence[ParamSpec]) -> LoadedWeights:
        tensors: dict[str, torch.Tensor] = {}
        noise: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        try:
            for spec in specs:
                for suffix, shape, dtype in storage_of(spec, self.dtype, self.quantized_storage):
                    t = _allocate(shape, dtype, self.device)
                    _fill_random(t, noise)
                    tensors[spec.name + suffix] = t
        except (torch.OutOfMemoryError, RuntimeError, MemoryError) as exc:
            allocated = sum(t.numel() * t.element_size() for t in tensors.values())
            tensors.clear()
            noise.clear()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise WeightsDoNotFitError(needed_bytes=self.bytes_needed(specs), allocated_bytes=allocated,
                                       device=self.device) from exc
        noise.clear()
        return LoadedWeights(
            tensors=tensors, total_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
            parameter_count=sum(s.numel for s in specs),
        )
