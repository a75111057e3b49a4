"""ServerArgs: every knob that changes KV sizing, named as SGLang names it.

A frozen msgspec Struct. Decode it with `ServerArgs.from_mapping` (a settings file:
kvcache.inputs.settings_file; field types: kvcache.inputs.server_arg_types) or `msgspec.convert`: a bad value fails with msgspec's path (`... - at $.page_size`),
an unknown field is refused, and cross-field rules run in `__post_init__`.
No environment variable changes any of this.
"""

from __future__ import annotations

import math
import re
import typing
from typing import Annotated, Any, Literal, Mapping

import msgspec

from kvcache.errors import ConfigError
from kvcache.inputs.engine_knobs import engine_knob_problems
from kvcache.inputs.server_arg_types import (
    DRAFT_MODEL_ALGORITHMS, ByteCount, EngineName, Fraction01, HybridSwaMemory, KVCacheDtypeName, ModelDtypeName,
    NonNegativeInt, PositiveInt, SpeculativeAlgorithm, also as _also, doc as _doc,
)
from kvcache.arithmetic import align_up
from kvcache.inputs.sglang_ratios import SGLANG_MAMBA_FULL_MEMORY_RATIO, SGLANG_MIN_RANK_MEMORY_RATIO, SGLANG_SWA_FULL_TOKENS_RATIO


class ServerArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The engine's sizing knobs. None means 'derive it', as SGLang does.

    Each field's description is its --flag's help: the CLI is generated from this class.
    """

    # the engine the plan is for (kvcache.engines)
    engine: Annotated[EngineName, _doc(
        "the engine whose rules the plan follows (which pools, what is reserved): sglang (SGLang 0.5.23) "
        "or vllm")] = "sglang"
    # vLLM's knobs (--engine vllm), spelled as vLLM 0.34.0 spells them (kvcache.engines.vllm_rules)
    gpu_memory_utilization: Annotated[float, msgspec.Meta(gt=0, le=1), _doc(
        "--engine vllm: share of the card vLLM may use for weights, activations and KV cache; vLLM 0.34.0's "
        "default is 1.0 (its extensible KV cache, on by default on CUDA; 0.92 without it)")] | None = None
    block_size: Annotated[PositiveInt, _doc(
        "--engine vllm: tokens per KV block, a multiple of 16 (FlashAttention's kernel block); default 64, "
        "grown next to Mamba / linear-attention layers")] | None = None
    max_model_len: Annotated[PositiveInt, _doc(
        "--engine vllm: the longest request (vLLM's max_model_len; at most the model's unless "
        "--allow-long-context)")] | None = None
    max_num_seqs: Annotated[PositiveInt, _doc(
        "--engine vllm: requests scheduled at once; vLLM 0.34.0's default is 1024 from 70 GiB cards but A100s, else 256")] | None = None
    max_num_batched_tokens: Annotated[PositiveInt, _doc(
        "--engine vllm: tokens one scheduler step takes (at least --max-num-seqs); default 16384 from 160 GiB cards, "
        "8192 from 70 GiB but A100s, else 2048")] | None = None
    enable_prefix_caching: Annotated[bool, _doc(
        "--engine vllm: prefix caching, on by default in vLLM 0.34.0 but for attention-free models (it puts hybrid "
        "models' Mamba layers in mamba_cache_mode align: 3 blocks a request per Mamba group); "
        "--no-enable-prefix-caching turns it off")] | None = None
    # memory budget
    mem_fraction_static: Annotated[Fraction01, _doc(
        "share of the card for weights + KV cache; derived from the card's size (SGLang's rule) when not given")] | None = None
    kv_cache_memory: Annotated[ByteCount, _doc(
        "absolute KV budget instead of --mem-fraction-static (checked against what is free)")] | None = None
    memory_limit: Annotated[ByteCount, _doc(
        "the host memory a CPU engine may use (default 8GiB; at most the host's memory)")] | None = None
    # capacity limits
    max_total_tokens: Annotated[PositiveInt, _doc("cap on KV tokens")] | None = None
    max_running_requests: Annotated[PositiveInt, _doc("cap on concurrent requests")] | None = None
    context_length: Annotated[PositiveInt, _doc("context length (at most the model's)")] | None = None
    allow_long_context: Annotated[bool, _doc("allow --context-length above the model's max_position_embeddings")] = False
    page_size: Annotated[PositiveInt, _doc(
        "tokens per KV page; default 1, and always 64 for DeepSeek sparse-attention models (SGLang 0.5.23's rule, "
        "kvcache.models.model_page_size)")] | None = None
    # formats
    dtype: Annotated[ModelDtypeName, _doc("model dtype; auto takes the checkpoint's torch_dtype")] = "auto"
    kv_cache_dtype: Annotated[KVCacheDtypeName, _doc(
        "KV cache dtype; auto is the model dtype, bf16 is bfloat16; with --engine vllm vLLM's own values (fp8 is "
        "fp8_e4m3)")] = "auto"
    # runtime reserve inputs (they set the derived mem_fraction_static)
    chunked_prefill_size: Annotated[PositiveInt, _doc(
        "prefill chunk in tokens (sets the activation reserve); default by card size")] | None = None
    cuda_graph_max_bs: Annotated[NonNegativeInt, _doc(
        "largest decode CUDA-graph batch (sets the graph reserve); default by card size and TP"),
        _also("--cuda-graph-max-bs-decode")] | None = None
    disable_cuda_graph: Annotated[bool, _doc(
        "no decode or prefill CUDA graphs (their reserve is then left out)")] = False
    disable_decode_cuda_graph: Annotated[bool, _doc(
        "no decode CUDA graphs (SGLang's flag): their reserve is left out and decode runs eagerly")] = False
    disable_cuda_graph_padding: Annotated[bool, _doc(
        "run decode batches between captured sizes eagerly (SGLang's flag): the measured headroom then runs an "
        "eager decode batch even below the largest graph")] = False
    disable_prefill_cuda_graph: Annotated[bool, _doc(
        "no prefill CUDA graphs (SGLang's flag): their reserve is left out")] = False
    enable_mixed_chunk: Annotated[bool, _doc(
        "mix the running decode requests into each prefill chunk (SGLang's flag): the measured headroom then "
        "runs that mixed step too")] = False
    disable_overlap_schedule: Annotated[bool, _doc(
        "no overlap scheduler (hybrid models then keep 3 or 4 state slots per request instead of 5)")] = False
    enable_post_capture_kv_resize: Annotated[bool, _doc(
        "size the KV pools again after CUDA-graph capture (CUDA target workers only)")] = False
    kv_headroom: Annotated[Literal["auto", "measured", "fraction"], _doc(
        "what the KV pools leave free on CUDA: measured runs the engine's worst-case step after graph capture and "
        "keeps its peak plus a margin; fraction keeps --mem-fraction-static's share; auto measures on a CUDA target "
        "worker whose pools can be resized when neither --mem-fraction-static nor --kv-cache-memory is given")] = "auto"
    # placement
    device: Annotated[Literal["auto", "cuda", "cpu", "meta"], _doc(
        "where the engine runs; auto is CUDA when present (plan always uses meta)")] = "auto"
    tp_size: Annotated[PositiveInt, _doc("tensor-parallel size"), _also("--tensor-parallel-size")] = 1
    pp_size: Annotated[PositiveInt, _doc("pipeline-parallel size"), _also("--pipeline-parallel-size")] = 1
    pp_layer_partition: Annotated[tuple[PositiveInt, ...], _doc(
        "layers each pipeline stage holds, comma-separated (7,7,7,8,8,8,8,8): one count a stage, summing to the "
        "model's layers; default SGLang 0.5.23's even split, the extra layers on the last stages (SGLang takes "
        "this from its SGLANG_PP_LAYER_PARTITION environment variable)")] | None = None
    dp_size: Annotated[PositiveInt, _doc("data-parallel size (attention DP with --enable-dp-attention)"),
                       _also("--data-parallel-size")] = 1
    enable_dp_attention: Annotated[bool, _doc("data-parallel attention over --dp-size groups")] = False
    load_format: Annotated[Literal["dummy"], _doc("weights are random tensors of the real size")] = "dummy"
    disable_radix_cache: Annotated[bool, _doc(
        "no prefix cache (hybrid models then keep one state slot per request)")] = False
    min_rank_memory_ratio: Annotated[float, msgspec.Meta(ge=0, le=1), _doc(
        "ranks refuse to start when one has less free memory before load than this fraction of another's "
        f"(SGLang 0.5.23's {SGLANG_MIN_RANK_MEMORY_RATIO}); 0 turns the check off")] = SGLANG_MIN_RANK_MEMORY_RATIO
    # hybrid models
    disable_hybrid_swa_memory: Annotated[bool, _doc(
        "one full pool for every attention layer, sliding ones included (SGLang 0.5.23's flag)")] = False
    enable_hybrid_swa_memory: Annotated[bool, _doc(
        "separate sliding-window pools for any model with sliding layers, even where the engine keeps one full "
        "pool (SGLang 0.5.23 does so for models outside its is_hybrid_swa_model list, Gemma-2/3 among them); "
        "a what-if: SGLang 0.5.23 itself has no such flag")] = False
    swa_full_tokens_ratio: Annotated[float, msgspec.Meta(gt=0, le=1), _doc(
        "sliding-window pool size as a fraction of the full pool")] = float(
        SGLANG_SWA_FULL_TOKENS_RATIO)
    mamba_full_memory_ratio: Annotated[float, msgspec.Meta(gt=0), _doc(
        "state : KV share of the budget for Mamba / linear-attention hybrids")] = float(
        SGLANG_MAMBA_FULL_MEMORY_RATIO)
    mamba_ssm_dtype: Annotated[Literal["float32", "bfloat16", "float16"], _doc("SSM state dtype")] = "float32"
    max_mamba_cache_size: Annotated[PositiveInt, _doc("state slots to keep (instead of the ratio)")] | None = None
    # multimodal models (SGLang 0.5.23's flags; kvcache.engines.sglang_multimodal)
    enable_multimodal: Annotated[bool, _doc(
        "serve the model's multimodal side (images, video, audio); unset, SGLang 0.5.23 turns it on for multimodal "
        "models but Gemma-3, Llama-4, Step3-VL and Inkling. On, a derived --mem-fraction-static is cut by 0.95 x a "
        "ViT-size factor and 100 MiB of the KV budget is kept for the embedding cache")] | None = None
    language_model_only: Annotated[bool, _doc(
        "serve a multimodal model as text only: none of SGLang 0.5.23's multimodal cuts to the KV budget")] = False
    # speculative decoding
    speculative_algorithm: Annotated[SpeculativeAlgorithm, _doc("speculative decoding")] = "none"
    speculative_draft_model: Annotated[str, _doc("draft model: a preset name, a model directory or a config.json"),
                                       _also("--speculative-draft-model-path")] | None = None
    speculative_num_steps: Annotated[PositiveInt, _doc("draft steps per verify")] | None = None
    speculative_eagle_topk: Annotated[PositiveInt, _doc("draft branches per step")] | None = None
    speculative_num_draft_tokens: Annotated[PositiveInt, _doc("tokens verified per step")] | None = None

    def __post_init__(self) -> None:
        for problem in [*_non_finite_problems(self), *_cross_field_problems(self)]:
            raise ConfigError(problem)

    # ---- construction -------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ServerArgs":
        """Validate a dict (CLI flags, a parsed file) into ServerArgs; ConfigError on bad input."""
        try:
            return msgspec.convert(dict(data), cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid server args: {exc}{_choices_of_failed_field(str(exc))}") from None

    def replace(self, **changes: Any) -> "ServerArgs":
        """A copy with some fields changed, validated like a fresh decode."""
        return ServerArgs.from_mapping({**msgspec.structs.asdict(self), **changes})

    # ---- derived ------------------------------------------------------
    @property
    def attention_dp_size(self) -> int:
        """Data-parallel attention groups (1 unless --enable-dp-attention)."""
        return self.dp_size if self.enable_dp_attention else 1

    @property
    def attention_tp_size(self) -> int:
        """Ranks one attention layer's heads are split over."""
        return self.tp_size // self.attention_dp_size

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm != "none"

    @property
    def hybrid_swa_memory(self) -> HybridSwaMemory:
        """'enable' / 'disable' as a flag asks, else 'auto': the engine's rules decide."""
        return "enable" if self.enable_hybrid_swa_memory else "disable" if self.disable_hybrid_swa_memory else "auto"

    @property
    def resolved_speculative_num_steps(self) -> int:
        return self.speculative_num_steps or 3

    @property
    def resolved_speculative_eagle_topk(self) -> int:
        return self.speculative_eagle_topk or 1

    @property
    def resolved_speculative_num_draft_tokens(self) -> int:
        """Tokens verified per step; with topk 1 it is num_steps + 1 (a chain)."""
        if self.speculative_num_draft_tokens is not None:
            return self.speculative_num_draft_tokens
        return self.resolved_speculative_num_steps + 1


def _choices_of_failed_field(message: str) -> str:
    """'; one of auto, bfloat16, ...' when msgspec refused a value of a field with fixed choices (its own
    message, "Invalid enum value 'fp8' - at `$.kv_cache_dtype`", names neither the choices nor the flag)."""
    match = re.search(r"at `\$\.(\w+)`", message)
    if match is None or match.group(1) not in ServerArgs.__struct_fields__:
        return ""
    hint: Any = typing.get_type_hints(ServerArgs, include_extras=True)[match.group(1)]
    while typing.get_origin(hint) is not Literal and typing.get_args(hint):
        hint = typing.get_args(hint)[0]  # Annotated[...] and X | None hold the Literal first
    if typing.get_origin(hint) is not Literal:
        return ""
    return f" (--{match.group(1).replace('_', '-')}: one of {', '.join(map(str, typing.get_args(hint)))})"


def _non_finite_problems(a: ServerArgs) -> list[str]:
    """A ratio read from a file may be inf (JSON Infinity, TOML inf), which msgspec's lower bounds let through."""
    return [f"--{f.name.replace('_', '-')} {value} is not a finite number; use one such as "
            f"{f.default if isinstance(f.default, float) else 0.5}"
            for f in msgspec.structs.fields(ServerArgs)
            if isinstance(value := getattr(a, f.name), float) and not math.isfinite(value)]


def token_cap_below_one_page(max_total_tokens: int | None, page_size: int) -> str | None:
    """The refusal of a --max-total-tokens below one page (the flag's page size or the one a model forces)."""
    if max_total_tokens is None or max_total_tokens >= page_size:
        return None
    return f"--max-total-tokens {max_total_tokens} is below one page (--page-size {page_size}); use at least {page_size}"


def _cross_field_problems(a: ServerArgs) -> list[str]:
    """Rules that tie fields together; each message names the flags and a fix."""
    defaults = dict(zip(ServerArgs.__struct_fields__, ServerArgs.__struct_defaults__))
    given = {f: v for f in ServerArgs.__struct_fields__ if (v := getattr(a, f)) != defaults[f]}
    problems: list[str] = engine_knob_problems(a.engine, given)
    if a.enable_hybrid_swa_memory and a.disable_hybrid_swa_memory:
        problems.append("--enable-hybrid-swa-memory and --disable-hybrid-swa-memory contradict each other: give one")
    if a.enable_multimodal and a.language_model_only:
        problems.append("--enable-multimodal and --language-model-only contradict each other: give one "
                        "(--language-model-only serves text only)")
    if a.mem_fraction_static is not None and a.kv_cache_memory is not None:
        problems.append(
            "--mem-fraction-static and --kv-cache-memory both set the KV budget: give only one "
            f"(got {a.mem_fraction_static} and {a.kv_cache_memory} bytes)"
        )
    if a.page_size is not None and (below := token_cap_below_one_page(a.max_total_tokens, a.page_size)):
        problems.append(below)
    if a.enable_dp_attention:
        if a.dp_size < 2:
            problems.append("--enable-dp-attention needs --dp-size of at least 2")
        elif a.tp_size % a.dp_size:
            divisor = _largest_divisor_at_most(a.tp_size, a.dp_size)
            fix = (f"try --dp-size {divisor}" if divisor >= 2 else
                   f"try --tp-size {align_up(a.tp_size, a.dp_size)}, or drop --enable-dp-attention")
            problems.append(
                f"--tp-size {a.tp_size} must be a multiple of --dp-size {a.dp_size} with --enable-dp-attention; {fix}"
            )
    algo = a.speculative_algorithm
    if algo in DRAFT_MODEL_ALGORITHMS and not a.speculative_draft_model:
        problems.append(f"--speculative-algorithm {algo} needs --speculative-draft-model (a preset or a path)")
    if algo == "NEXTN" and a.speculative_draft_model:
        problems.append(
            "--speculative-algorithm NEXTN drafts with the target's own next-token-prediction layers; "
            "drop --speculative-draft-model"
        )
    if algo != "none" and a.pp_size > 1:
        problems.append(f"--speculative-algorithm {algo} is not supported with --pp-size {a.pp_size}; use --pp-size 1")
    if algo == "none":
        given = [name for name in ("speculative_draft_model", "speculative_num_steps",
                                   "speculative_eagle_topk", "speculative_num_draft_tokens")
                 if getattr(a, name) is not None]
        if given:
            flags = ", ".join("--" + g.replace("_", "-") for g in given)
            problems.append(f"{flags} given without --speculative-algorithm; set one (EAGLE, EAGLE3, STANDALONE, NEXTN)")
    elif a.speculative_eagle_topk in (None, 1) and a.speculative_num_draft_tokens is not None:
        steps = a.resolved_speculative_num_steps
        if a.speculative_num_draft_tokens != steps + 1:
            problems.append(
                f"with --speculative-eagle-topk 1 the draft is a chain: --speculative-num-draft-tokens must be "
                f"--speculative-num-steps + 1 = {steps + 1} (got {a.speculative_num_draft_tokens})"
            )
    return problems


def _largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of n not above limit: the divisors come in pairs (d, n // d) with d <= isqrt(n), so at
    most isqrt(n) candidates are tried, however large limit is (a --dp-size of 2**31 - 1 answers at once)."""
    pairs = ((d, n // d) for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return max(x for pair in pairs for x in pair if x <= limit)
