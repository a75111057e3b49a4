"""Which knobs each --engine reads: the other engine's knobs and spellings are refused in one line naming this one's.

Under --engine vllm the plan reads vLLM 0.34.0's own flags (`--max-model-len`, `--kv-cache-dtype fp8`, ...); SGLang's
given there are refused naming vLLM's flag for each (kvcache.inputs.other_engines_flags), and vLLM's given under
SGLang's rules are refused naming SGLang's. vLLM's start-up checks, which need the card, are in
kvcache.engines.vllm_rules.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvcache.inputs.other_engines_flags import (
    NO_VLLM_COUNTERPART, SGLANG_KV_DTYPE_NAMES, SGLANG_KV_DTYPES, VLLM_COUNTERPARTS, VLLM_FIELDS, VLLM_KV_DTYPE_NAMES,
    VLLM_MODELLED_KV_DTYPES, VLLM_NAMES,
)

# What `plan --engine vllm` reads (vLLM's own knobs and the ones both engines spell alike); any other field given
# there is SGLang's and is refused, naming vLLM's flag for it where one exists (other_engines_flags.VLLM_COUNTERPARTS)
VLLM_READS = frozenset({"engine", *VLLM_FIELDS, "allow_long_context", "dtype", "kv_cache_dtype", "device", "tp_size",
                        "pp_size", "load_format", "memory_limit"})


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _sglang_problems(given: Mapping[str, Any]) -> list[str]:
    """vLLM's knobs and spellings given without --engine vllm: refused, each with SGLang's flag for it."""
    problems = [f"{_flag(f)} is vLLM's knob: add --engine vllm, or with SGLang's rules use {VLLM_NAMES[f]}"
                for f in VLLM_FIELDS if f in given]
    dtype = given.get("kv_cache_dtype", "auto")
    if dtype not in SGLANG_KV_DTYPES:
        ours = VLLM_KV_DTYPE_NAMES.get(dtype)
        problems.append(f"--kv-cache-dtype {dtype} is vLLM's spelling: add --engine vllm, or with SGLang's rules use "
                        + (f"--kv-cache-dtype {ours}" if ours else
                           "one SGLang 0.5.23 takes (auto, bfloat16, fp8_e4m3, fp8_e5m2, fp4_e2m1)"))
    return problems


def _vllm_problems(given: Mapping[str, Any]) -> list[str]:
    """SGLang's knobs and spellings given with --engine vllm: refused, each with vLLM's flag for it where it has one
    (vLLM's own start-up checks need the card and run in kvcache.engines.vllm_rules)."""
    sglang = [f for f in given if f not in VLLM_READS]
    problems = []
    if sglang:
        problems.append(f"SGLang's knob{'s' if len(sglang) > 1 else ''} under --engine vllm: " + "; ".join(
            f"{_flag(f)} ({VLLM_COUNTERPARTS.get(f, NO_VLLM_COUNTERPART)})" for f in sglang))
    dtype = given.get("kv_cache_dtype", "auto")
    if dtype in SGLANG_KV_DTYPE_NAMES:
        problems.append(f"--kv-cache-dtype {dtype} is SGLang's spelling: under --engine vllm {SGLANG_KV_DTYPE_NAMES[dtype]}")
    elif dtype not in VLLM_MODELLED_KV_DTYPES and dtype not in SGLANG_KV_DTYPES:
        problems.append(f"--kv-cache-dtype {dtype} (vLLM 0.34.0's) is not modelled for --engine vllm; use one of "
                        f"{', '.join(VLLM_MODELLED_KV_DTYPES)}")
    if given.get("pp_size", 1) > 1:
        problems.append(f"--pp-size {given['pp_size']} is not modelled for --engine vllm; use --pp-size 1")
    return problems


def engine_knob_problems(engine: str, given: Mapping[str, Any]) -> list[str]:
    """The other engine's knobs among those `given` (the fields set to other than their default), each named with
    --engine's flag for it."""
    return _vllm_problems(given) if engine == "vllm" else _sglang_problems(given)
