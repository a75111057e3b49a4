"""The types of ServerArgs' fields: bounded counts and byte sizes, each knob's accepted names, and the marks the
CLI reads (a field's help text, its other spellings)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# Every count here (tokens, requests, pages, steps, ranks) ends up as, or below, an int32 index on the device
# (the request table maps positions to token indices in int32, as SGLang's does): larger is no setup at all.
MAX_COUNT = 2**31 - 1
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Fraction01 = Annotated[float, msgspec.Meta(gt=0, lt=1)]
# A count of bytes; the CLI reads it as a size ("80GiB") because of the "unit" mark.
MAX_BYTES = 2**63 - 1  # what a torch size holds; past it no memory exists (and GiB as a float overflows)
ByteCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_BYTES, extra={"unit": "bytes"})]

# SGLang 0.5.23's names, then vLLM 0.34.0's others (its CacheDType, config/cache.py): each engine takes its own
# (kvcache.inputs.other_engines_flags says which the other spells otherwise)
KVCacheDtypeName = Literal["auto", "bfloat16", "bf16", "float16", "float32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1",
                           "fp8", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla", "nvfp4", "nvfp4_4over6",
                           "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                           "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
                           "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head"]
ModelDtypeName = Literal["auto", "bfloat16", "float16", "float32", "half", "float", "bf16", "fp16", "fp32"]
SpeculativeAlgorithm = Literal["none", "EAGLE", "EAGLE3", "STANDALONE", "NEXTN"]
HybridSwaMemory = Literal["auto", "enable", "disable"]  # who decides on separate sliding-window pools
EngineName = Literal["sglang", "vllm"]  # kvcache.engines.ENGINES holds each one's rules

DRAFT_MODEL_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


def doc(text: str) -> msgspec.Meta:
    """A field's help text (the CLI's --help line)."""
    return msgspec.Meta(description=text)


def also(*flags: str) -> msgspec.Meta:
    """SGLang 0.5.23's other spellings of a field's flag (`--tensor-parallel-size` for `--tp-size`)."""
    return msgspec.Meta(extra={"aliases": flags})
