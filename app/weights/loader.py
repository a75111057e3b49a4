"""DummyWeightLoader: real-size random weights on the device, the way SGLang and vLLM profile without a checkpoint.

Quantized checkpoints keep their narrow storage, because that is what occupies the
card: the format is the model description's (`ModelConfig.weights.quantization`, read once
from quantization_config by kvcache.models.quantization, which lists each format's tensors);
only specs marked `quantized` (linear weights the format covers) are stored narrow.

`storage_of` (the format's `stored`, app.weights.storage) is the one formula for what holds a parameter;
`bytes_needed` (the up-front figure) and `load` (the allocation) both go through it, so they agree.
All tensors are carved from ONE allocation (kvcache.memory.device_buffers.Arena, each tensor
512-byte aligned, the whole a 2 MiB multiple of at least 10 MiB): on CUDA it takes a
segment of its own, so the reported weight bytes are exactly what cudaMemGetInfo loses
(and what a dry run debits), with no shared caching-allocator segments left half used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from app.weights.shapes import ParamSpec, parameter_count
from app.weights.storage import NO_QUANTIZATION, arena_bytes, bytes_needed, stored_tensors
from kvcache.inputs.dtypes import DType
from kvcache.memory.device_buffers import Arena
from kvcache.memory.torch_dtypes import torch_dtype
from kvcache.models.quantization import Quantization
from kvcache.memory.out_of_memory import is_out_of_memory

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
    """A block of random values: small uniform floats, or random bytes for integer storage (uint8 fp8 / mxfp4,
    int32 packed ints and zero points)."""
    if dtype.is_floating_point:
        block = torch.empty(NOISE_ELEMENTS, dtype=dtype, device=device)
        return block.uniform_(-NOISE_RANGE, NOISE_RANGE, generator=generator)
    raw = torch.empty(NOISE_ELEMENTS * dtype.itemsize, dtype=torch.uint8, device=device)
    return raw.random_(0, 256, generator=generator).view(dtype)


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
    """Allocates every parameter on `device` (in `dtype`, or the `quantization` format) and fills it with noise.

    On the meta device nothing is allocated and nothing filled; the bytes are still reported.
    """

    device: torch.device
    dtype: DType
    quantization: Quantization = NO_QUANTIZATION
    seed: int = 0

    def bytes_needed(self, specs: Sequence[ParamSpec]) -> int:
        """What `load(specs)` will allocate, in bytes."""
        return bytes_needed(specs, self.dtype, self.quantization)

    def load(self, specs: Sequence[ParamSpec]) -> LoadedWeights:
        """Allocate and fill every tensor; if the device refuses the memory, raise WeightsDoNotFitError."""
        stored = stored_tensors(specs, self.dtype, self.quantization)
        needed = arena_bytes(stored)
        try:
            arena = _arena(needed, self.device)
        except Exception as error:
            if not is_out_of_memory(error):
                raise  # not out of memory: a bug, reported as one
            raise WeightsDoNotFitError(needed_bytes=needed, allocated_bytes=0, device=self.device) from error
        tensors = {t.name: arena.take(t.shape, torch_dtype(t.dtype), self.device) for t in stored}
        if self.device.type != "meta":
            self._fill_all(tensors)
        return LoadedWeights(tensors=MappingProxyType(tensors), total_bytes=arena.nbytes,
                             tensor_bytes=sum(t.nbytes for t in stored),
                             parameter_count=parameter_count(specs))

    def _fill_all(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Tile one block of noise per dtype over every tensor."""
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        noise: dict[torch.dtype, torch.Tensor] = {}
        for tensor in tensors.values():
            if tensor.dtype not in noise:
                noise[tensor.dtype] = _noise(tensor.dtype, self.device, generator)
            if tensor.numel():
                _fill(tensor, noise[tensor.dtype])
