"""DummyWeightLoader: real-size random weights on the device, the way SGLang and vLLM profile without a checkpoint.

Quantized checkpoints keep their narrow storage, because that is what occupies the
card. Only specs marked `quantized` (linear weights the quantization_config covers)
are stored narrow:

- ``"fp8"``: the weight as uint8, one byte per element, plus a float32 ``<name>_scale_inv``
  of ceil(rows / block) x ceil(cols / block) per matrix for block quantization
  (DeepSeek-V3's weight_block_size [128, 128]), or one float32 per matrix when
  ``fp8_block_size`` is None (per-tensor scales).
- ``"mxfp4"`` (gpt-oss experts): the weight as uint8 of ceil(cols / 2) per row, two
  4-bit values a byte, plus uint8 ``<name>_scales`` of ceil(cols / 32) per row
  (one shared E8M0 exponent per 32 elements along the input dimension).

`storage_of` is the one formula for what holds a parameter; `bytes_needed` (the
up-front figure) and `load` (the allocation) both go through it, so they agree.
All tensors are carved from ONE allocation (kvcache.device_buffers.Arena, each tensor
512-byte aligned, the whole a 2 MiB multiple of at least 10 MiB): on CUDA it takes a
segment of its own, so the reported weight bytes are exactly what cudaMemGetInfo loses
(and what a dry run debits), with no shared caching-allocator segments left half used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import torch

from app.weights.shapes import ParamSpec
from kvcache.device_buffers import Arena, arena_size, slot_size

QuantizedStorage = Literal["fp8", "mxfp4"]
MXFP4_GROUP = 32
NOISE_ELEMENTS = 1 << 16
NOISE_RANGE = 1e-3
_GIB = 1 << 30


class WeightsDoNotFitError(ValueError):
    """Allocating the weights failed part-way; everything allocated has been freed."""

    def __init__(self, *, needed_bytes: int, allocated_bytes: int, device: torch.device) -> None:
        self.needed_bytes = needed_bytes
        self.allocated_bytes = allocated_bytes
        self.device = device
        super().__init__(
            f"the model weights need {needed_bytes / _GIB:.2f} GiB on {device} but allocation failed after "
            f"{allocated_bytes / _GIB:.2f} GiB (freed); shard them over more devices with a larger --tp-size"
        )


def quantized_storage_for(hf_config: Mapping[str, Any]) -> QuantizedStorage | None:
    """The narrow storage a checkpoint's quantization_config.quant_method implies; None for anything else."""
    method = (hf_config.get("quantization_config") or {}).get("quant_method")
    return method if method in ("fp8", "mxfp4") else None


def fp8_block_size_for(hf_config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The fp8 scale block (quantization_config.weight_block_size), or None for per-tensor scales."""
    block = (hf_config.get("quantization_config") or {}).get("weight_block_size")
    return (int(block[0]), int(block[1])) if block else None


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor that holds (part of) a parameter: the weight itself or its scales."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def storage_of(spec: ParamSpec, dtype: torch.dtype, quantized_storage: QuantizedStorage | None,
               fp8_block_size: tuple[int, int] | None = (128, 128)) -> tuple[StoredTensor, ...]:
    """The tensors that hold one parameter, in the formats the module docstring describes."""
    if not spec.quantized or quantized_storage is None:
        return (StoredTensor(spec.name, spec.shape, dtype),)
    *lead, rows, cols = spec.shape
    if quantized_storage == "fp8":
        if fp8_block_size is None:
            scales = tuple(lead)
        else:
            scales = (*lead, -(-rows // fp8_block_size[0]), -(-cols // fp8_block_size[1]))
        return (StoredTensor(spec.name, spec.shape, torch.uint8),
                StoredTensor(f"{spec.name}_scale_inv", scales, torch.float32))
    if quantized_storage == "mxfp4":
        return (StoredTensor(spec.name, (*lead, rows, -(-cols // 2)), torch.uint8),
                StoredTensor(f"{spec.name}_scales", (*lead, rows, -(-cols // MXFP4_GROUP)), torch.uint8))
    raise ValueError(f"unknown quantized storage {quantized_storage!r}; supported: 'fp8', 'mxfp4', None")


def _stored(specs: Sequence[ParamSpec], dtype: torch.dtype, quantized_storage: QuantizedStorage | None,
            fp8_block_size: tuple[int, int] | None) -> list[StoredTensor]:
    return [t for spec in specs for t in storage_of(spec, dtype, quantized_storage, fp8_block_size)]


def _arena_bytes(stored: Sequence[StoredTensor]) -> int:
    """The one arena that holds these tensors, each in its aligned slot."""
    return arena_size(sum(slot_size(t.nbytes) for t in stored))


def bytes_needed(specs: Sequence[ParamSpec], dtype: torch.dtype, quantized_storage: QuantizedStorage | None,
                 fp8_block_size: tuple[int, int] | None = (128, 128)) -> int:
    """Exact bytes `load` will allocate for these specs, scales included: the one arena."""
    return _arena_bytes(_stored(specs, dtype, quantized_storage, fp8_block_size))


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedWeights:
    """The allocated tensors (read-only mapping), the bytes their one allocation took
    (`total_bytes`, alignment included), the bytes of the tensors themselves, and the
    model's parameter count."""

    tensors: Mapping[str, torch.Tensor]
    total_bytes: int
    tensor_bytes: int
    parameter_count: int


def _arena(nbytes: int, device: torch.device) -> Arena:
    """The one allocation call (tests replace it to fail)."""
    return Arena(nbytes, device, zeroed=False)


def _noise(dtype: torch.dtype, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """A block of random values: small uniform floats, or random bytes for uint8 storage."""
    block = torch.empty(NOISE_ELEMENTS, dtype=dtype, device=device)
    if dtype == torch.uint8:
        return block.random_(0, 256, generator=generator)
    return block.uniform_(-NOISE_RANGE, NOISE_RANGE, generator=generator)


def _fill(tensor: torch.Tensor, noise: torch.Tensor) -> None:
    """Tile the noise block over the tensor in one broadcast copy plus a tail.

    Dummy weights need their size and finite values, not fresh entropy per element;
    tiling touches every byte at memory speed (a 135M model in well under a second
    on two CPU cores, where uniform_ over every element takes several times longer).
    """
    flat, chunk = tensor.view(-1), noise.numel()
    rows = flat.numel() // chunk
    if rows:
        flat[: rows * chunk].view(rows, chunk).copy_(noise.expand(rows, chunk))
    tail = flat.numel() - rows * chunk
    if tail:
        flat[rows * chunk:].copy_(noise[:tail])


@dataclass(frozen=True, slots=True, kw_only=True)
class DummyWeightLoader:
    """Allocates every parameter on `device` (in `dtype`, or its narrow storage) and fills it with noise.

    On the meta device nothing is allocated and nothing filled; the bytes are still reported.
    """

    device: torch.device
    dtype: torch.dtype
    quantized_storage: QuantizedStorage | None = None
    fp8_block_size: tuple[int, int] | None = (128, 128)
    seed: int = 0

    def bytes_needed(self, specs: Sequence[ParamSpec]) -> int:
        """What `load(specs)` will allocate, in bytes."""
        return bytes_needed(specs, self.dtype, self.quantized_storage, self.fp8_block_size)

    def load(self, specs: Sequence[ParamSpec]) -> LoadedWeights:
        """Allocate and fill every tensor; on failure free them all and raise WeightsDoNotFitError."""
        stored = _stored(specs, self.dtype, self.quantized_storage, self.fp8_block_size)
        needed = _arena_bytes(stored)
        try:
            arena = _arena(needed, self.device)
        except RuntimeError as error:  # torch.OutOfMemoryError is a RuntimeError
            raise WeightsDoNotFitError(needed_bytes=needed, allocated_bytes=0, device=self.device) from error
        tensors = {t.name: arena.take(t.shape, t.dtype, self.device) for t in stored}
        if self.device.type != "meta":
            self._fill_all(tensors)
        return LoadedWeights(tensors=MappingProxyType(tensors), total_bytes=arena.nbytes,
                             tensor_bytes=sum(t.nbytes for t in stored),
                             parameter_count=sum(spec.numel for spec in specs))

    def _fill_all(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Tile one block of noise per dtype over every tensor."""
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        noise: dict[torch.dtype, torch.Tensor] = {}
        for tensor in tensors.values():
            if tensor.dtype not in noise:
                noise[tensor.dtype] = _noise(tensor.dtype, self.device, generator)
            if tensor.numel():
                _fill(tensor, noise[tensor.dtype])
