"""Element formats: the model dtype and the KV cache dtype, and the bytes each takes.

A dtype in a plan is data: a `DType` is torch's name for an element type and its bytes, so planning
imports no torch; it becomes a `torch.dtype` only where tensors are made (kvcache.memory.torch_dtypes).

`KVCacheDtype.row_bytes(heads, dim)` is the one formula for the bytes of cached values,
the sum of the buffers a pool allocates for them (`row_buffers`): whole-byte formats take
heads * dim * size; FP4 packs each head's dim values into dim / 2 bytes plus one scale byte
per 16 values, so a head dim that is not a multiple of 16 is refused (ConfigError).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.errors import ConfigError
from kvcache.inputs.other_engines_flags import VLLM_KV_DTYPE_NAMES


@dataclass(frozen=True, slots=True)
class DType:
    """One element type as a plan states it: torch's name for it (`torch.<name>`) and its bytes."""

    name: str
    itemsize: int


BFLOAT16, FLOAT16, FLOAT32 = DType("bfloat16", 2), DType("float16", 2), DType("float32", 4)
FLOAT8_E4M3FN, FLOAT8_E5M2 = DType("float8_e4m3fn", 1), DType("float8_e5m2", 1)
UINT8, INT32, INT64, BOOL = DType("uint8", 1), DType("int32", 4), DType("int64", 8), DType("bool", 1)
DTYPES: dict[str, DType] = {d.name: d for d in (BFLOAT16, FLOAT16, FLOAT32, FLOAT8_E4M3FN, FLOAT8_E5M2,
                                                 UINT8, INT32, INT64, BOOL)}

# Every name torch 2.x gives a dtype (`torch.<name>`): what a checkpoint's torch_dtype may say (kvcache.models.fields)
TORCH_DTYPE_NAMES = frozenset((
    "bcomplex32", "bfloat16", "bit", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool", "cdouble", "cfloat",
    "chalf", "complex128", "complex32", "complex64", "double", "float", "float16", "float32", "float4_e2m1fn_x2",
    "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "half", "int",
    "int1", "int16", "int2", "int3", "int32", "int4", "int5", "int6", "int64", "int7", "int8", "long", "qint32",
    "qint8", "quint2x4", "quint4x2", "quint8", "short", "uint1", "uint16", "uint2", "uint3", "uint32", "uint4",
    "uint5", "uint6", "uint64", "uint7", "uint8"))


def dtype_named(name: str) -> DType:
    """The DType torch calls `name` ('bfloat16', 'int64', ...): the element types a plan's tensors use."""
    return DTYPES[name]


MODEL_DTYPES: dict[str, DType] = {
    "bfloat16": BFLOAT16, "bf16": BFLOAT16,
    "float16": FLOAT16, "half": FLOAT16, "fp16": FLOAT16,
    "float32": FLOAT32, "float": FLOAT32, "fp32": FLOAT32,
}


@dataclass(frozen=True, slots=True)
class KVCacheDtype:
    """One KV cache element format: its logical element type and the one it is stored in."""

    name: str
    element_dtype: DType
    storage_dtype: DType
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
        return self.storage_dtype == UINT8


def _whole(dtype: DType) -> KVCacheDtype:
    return KVCacheDtype(name=dtype.name, element_dtype=dtype, storage_dtype=dtype, bits=dtype.itemsize * 8)


KV_CACHE_DTYPES: dict[str, KVCacheDtype] = {
    "bfloat16": _whole(BFLOAT16),
    "float16": _whole(FLOAT16),
    "float32": _whole(FLOAT32),
    "fp8_e4m3": KVCacheDtype("fp8_e4m3", FLOAT8_E4M3FN, UINT8, 8),
    "fp8_e5m2": KVCacheDtype("fp8_e5m2", FLOAT8_E5M2, UINT8, 8),
    "fp4_e2m1": KVCacheDtype("fp4_e2m1", UINT8, UINT8, 4, scale_group=16),
}

# SGLang 0.5.23 accepts bf16 for bfloat16; vLLM 0.34.0's fp8 is fp8_e4m3 on CUDA (ServerArgs takes each under its engine)
KV_CACHE_DTYPE_ALIASES = {"bf16": "bfloat16", **VLLM_KV_DTYPE_NAMES}

STATE_DTYPES: dict[str, DType] = {d.name: d for d in (FLOAT32, BFLOAT16, FLOAT16)}  # a recurrent state's (--mamba-ssm-dtype)


def resolve_model_dtype(requested: str, checkpoint_dtype: str | None) -> DType:
    """`dtype="auto"` takes the checkpoint's torch_dtype (float32 checkpoints run in
    bfloat16, as vLLM does); otherwise the named dtype."""
    if requested != "auto":
        return MODEL_DTYPES[requested]
    if checkpoint_dtype is None:
        return BFLOAT16
    if checkpoint_dtype not in MODEL_DTYPES:
        raise ConfigError(
            f"the checkpoint's torch_dtype {checkpoint_dtype!r} is not a model dtype this engine runs; "
            "pass --dtype bfloat16 (or float16)"
        )
    dtype = MODEL_DTYPES[checkpoint_dtype]
    return BFLOAT16 if dtype == FLOAT32 else dtype


def resolve_kv_cache_dtype(requested: str, model_dtype: DType) -> KVCacheDtype:
    """`kv_cache_dtype="auto"` means the model dtype; "bf16" is SGLang's other name for bfloat16."""
    if requested == "auto":
        return KV_CACHE_DTYPES[model_dtype.name]
    return KV_CACHE_DTYPES[KV_CACHE_DTYPE_ALIASES.get(requested, requested)]
