"""ServerArgs: every knob that changes KV sizing, named as SGLang names it.

A frozen msgspec Struct. Decode it with `ServerArgs.from_mapping` / `from_file` (or
`msgspec.convert`): a bad value fails with msgspec's path (`... - at $.page_size`),
an unknown field is refused, and cross-field rules run in `__post_init__`.
No environment variable changes any of this.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import msgspec

from kvcache.errors import ConfigError

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
Fraction01 = Annotated[float, msgspec.Meta(gt=0, lt=1)]

KVCacheDtypeName = Literal["auto", "bfloat16", "float16", "float32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"]
ModelDtypeName = Literal["auto", "bfloat16", "float16", "float32", "half", "float", "bf16", "fp16", "fp32"]
SpeculativeAlgorithm = Literal["none", "EAGLE", "EAGLE3", "STANDALONE", "NEXTN"]

DRAFT_MODEL_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


class ServerArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The engine's sizing knobs. None means 'derive it', as SGLang does."""

    # memory budget
    mem_fraction_static: Fraction01 | None = None
    kv_cache_memory: PositiveInt | None = None
    memory_limit: PositiveInt | None = None
    # capacity limits
    max_total_tokens: PositiveInt | None = None
    max_running_requests: PositiveInt | None = None
    context_length: PositiveInt | None = None
    allow_long_context: bool = False
    page_size: PositiveInt = 1
    # formats
    dtype: ModelDtypeName = "auto"
    kv_cache_dtype: KVCacheDtypeName = "auto"
    # runtime reserve inputs (they set the derived mem_fraction_static)
    chunked_prefill_size: PositiveInt | None = None
    cuda_graph_max_bs: NonNegativeInt | None = None
    # size the KV pools again after CUDA-graph capture (kvcache.runtime; CUDA target workers only)
    enable_post_capture_kv_resize: bool = False
    # placement
    device: Literal["auto", "cuda", "cpu", "meta"] = "auto"
    tp_size: PositiveInt = 1
    pp_size: PositiveInt = 1
    dp_size: PositiveInt = 1
    enable_dp_attention: bool = False
    load_format: Literal["dummy"] = "dummy"
    disable_radix_cache: bool = False
    # hybrid models
    swa_full_tokens_ratio: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
    mamba_full_memory_ratio: Annotated[float, msgspec.Meta(gt=0)] = 0.9
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_mamba_cache_size: PositiveInt | None = None
    # speculative decoding
    speculative_algorithm: SpeculativeAlgorithm = "none"
    speculative_draft_model: str | None = None
    speculative_num_steps: PositiveInt | None = None
    speculative_eagle_topk: PositiveInt | None = None
    speculative_num_draft_tokens: PositiveInt | None = None

    def __post_init__(self) -> None:
        for problem in _cross_field_problems(self):
            raise ConfigError(problem)

    # ---- construction -------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ServerArgs":
        """Validate a dict (CLI flags, a parsed file) into ServerArgs; ConfigError on bad input."""
        try:
            return msgspec.convert(dict(data), cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid server args: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "ServerArgs":
        """Read ServerArgs from a TOML (.toml) or JSON file."""
        return cls.from_mapping(read_settings_file(path))

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


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A TOML or JSON file as a dict; dashes in keys become underscores (flag spelling)."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text.decode()) if p.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a table/object of server args, not {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _cross_field_problems(a: ServerArgs) -> list[str]:
    """Rules that tie fields together; each message names the flags and a fix."""
    problems: list[str] = []
    if a.mem_fraction_static is not None and a.kv_cache_memory is not None:
        problems.append(
            "--mem-fraction-static and --kv-cache-memory both set the KV budget: give only one "
            f"(got {a.mem_fraction_static} and {a.kv_cache_memory} bytes)"
        )
    if a.max_total_tokens is not None and a.max_total_tokens < a.page_size:
        problems.append(
            f"--max-total-tokens {a.max_total_tokens} is below one page (--page-size {a.page_size}); "
            f"use at least {a.page_size}"
        )
    if a.enable_dp_attention:
        if a.dp_size < 2:
            problems.append("--enable-dp-attention needs --dp-size of at least 2")
        elif a.tp_size % a.dp_size:
            divisor = _largest_divisor_at_most(a.tp_size, a.dp_size)
            fix = (f"try --dp-size {divisor}" if divisor >= 2 else
                   f"try --tp-size {-(-a.tp_size // a.dp_size) * a.dp_size}, or drop --enable-dp-attention")
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
    return max(d for d in range(1, limit + 1) if n % d == 0)
