"""Element formats: the model dtype and the KV cache dtype, and the bytes each takes.

`KVCacheDtype.row_bytes(heads, dim)` is the one formula for the bytes of cached values,
the sum of the buffers a pool allocates for them (`row_buffers`): whole-byte formats take
heads * dim * size; FP4 packs each head's dim values into dim / 2 bytes plus one scale byte
per 16 values, so a head dim that is not a multiple of 16 is refused (ConfigError).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache.errors import ConfigError
from kvcache.inputs.other_engines_flags import VLLM_KV_DTYPE_NAMES

MODEL_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
}


@dataclass(frozen=True, slots=True)
class KVCacheDtype:
    """One KV cache element format: its logical torch dtype and how it is stored."""

    name: str
    torch_dtype: torch.dtype
    storage_dtype: torch.dtype
    bits: int
    scale_group: int = 0

    def check_packs(self, elements: int) -> None:
        """ConfigError unless `elements` values (one head vector) pack whole: FP4 needs a multiple of 16."""
        if (elements * self.bits) % 8 or (self.scale_group and elements % self.scale_group):
            group = max(self.scale_group, 8 // self.bits if self.bits < 8 else 1)
            raise ConfigError(
                f"{elements} elements cannot be stored as {self.name}: the count must be a multiple of {group} "
                f"(a head dimension of {elements} needs --kv-cache-dtype fp8_e4m3 or the model dtype)"
            )

    def data_elements(self, elements: int) -> int:
        """Storage elements of the data part for `elements` values (FP4 packs two per byte)."""
        self.check_packs(elements)
        return elements * self.bits // (8 * self.storage_dtype.itemsize)

    def scale_elements(self, elements: int) -> int:
        """Storage elements (bytes) of the per-group scales; 0 for formats without scales."""
        self.check_packs(elements)
        return elements // self.scale_group if self.scale_group else 0

    def row_buffers(self, heads: int, dim: int) -> tuple[int, ...]:
        """Bytes per row of the buffers holding [heads, dim] values: (data,) or (data, scales) for FP4.
        Each head's vector packs on its own, so `dim` must pack (check_packs)."""
        data = heads * self.data_elements(dim) * self.storage_dtype.itemsize
        return (data, heads * self.scale_elements(dim)) if self.scale_group else (data,)

    def row_bytes(self, heads: int, dim: int) -> int:
        """Bytes one token's [heads, dim] values take in the cache, scales included: THE byte formula,
        the sum of the buffers a pool allocates (row_buffers)."""
        return sum(self.row_buffers(heads, dim))

    def bytes_for(self, elements: int) -> int:
        """Bytes of one vector of `elements` values (row_bytes of one head)."""
        return self.row_bytes(1, elements)

    @property
    def stored_as_bytes(self) -> bool:
        """FP8/FP4 live in uint8 tensors: torch lacks index_put for them on some backends."""
        return self.storage_dtype == torch.uint8


def _whole(name: str, dtype: torch.dtype) -> KVCacheDtype:
    return KVCacheDtype(name=name, torch_dtype=dtype, storage_dtype=dtype, bits=dtype.itemsize * 8)


KV_CACHE_DTYPES: dict[str, KVCacheDtype] = {
    "bfloat16": _whole("bfloat16", torch.bfloat16),
    "float16": _whole("float16", torch.float16),
    "float32": _whole("float32", torch.float32),
    "fp8_e4m3": KVCacheDtype("fp8_e4m3", torch.float8_e4m3fn, torch.uint8, 8),
    "fp8_e5m2": KVCacheDtype("fp8_e5m2", torch.float8_e5m2, torch.uint8, 8),
    "fp4_e2m1": KVCacheDtype("fp4_e2m1", torch.uint8, torch.uint8, 4, scale_group=16),
}

# SGLang 0.5.23 accepts bf16 for bfloat16; vLLM 0.34.0's fp8 is fp8_e4m3 on CUDA (ServerArgs takes each under its engine)
KV_CACHE_DTYPE_ALIASES = {"bf16": "bfloat16", **VLLM_KV_DTYPE_NAMES}

_TORCH_TO_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def model_dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: the name ServerArgs and reports use."""
    return _TORCH_TO_NAME[dtype]


def resolve_model_dtype(requested: str, checkpoint_dtype: str | None) -> torch.dtype:
    """`dtype="auto"` takes the checkpoint's torch_dtype (float32 checkpoints run in
    bfloat16, as vLLM does); otherwise the named dtype."""
    if requested != "auto":
        return MODEL_DTYPES[requested]
    if checkpoint_dtype is None:
        return torch.bfloat16
    if checkpoint_dtype not in MODEL_DTYPES:
        raise ConfigError(
            f"the checkpoint's torch_dtype {checkpoint_dtype!r} is not a model dtype this engine runs; "
            "pass --dtype bfloat16 (or float16)"
        )
    dtype = MODEL_DTYPES[checkpoint_dtype]
    return torch.bfloat16 if dtype == torch.float32 else dtype


def resolve_kv_cache_dtype(requested: str, model_dtype: torch.dtype) -> KVCacheDtype:
    """`kv_cache_dtype="auto"` means the model dtype; "bf16" is SGLang's other name for bfloat16."""
    if requested == "auto":
        return KV_CACHE_DTYPES[model_dtype_name(model_dtype)]
    return KV_CACHE_DTYPES[KV_CACHE_DTYPE_ALIASES.get(requested, requested)]
