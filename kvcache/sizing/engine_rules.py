"""EngineRules: the questions planning asks the engine a plan is for.

The base lives here, on the sizing floor, so that `WorkerSizing` can hold one; each engine version's
rules (SGLang 0.5.23's, ...) live above, in `kvcache.engines`, and the configurator hands one in.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Literal

import msgspec

from kvcache.arithmetic import exact_fraction
from kvcache.byte_units import MiB
from kvcache.inputs.server_arg_types import HybridSwaMemory
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.sizing.memory_budget import MIN_DERIVED_FRACTION
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.sizing.plan_request import PlanRequest, StartupMinimums
from kvcache.sizing.pool_config import BelowOneRequest, MemoryPoolConfig


class WindowPools(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a model's sliding-window layers get pools of their own, and why (the report may say it)."""

    separate: bool
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MultimodalMemory:
    """What an engine keeps back for a model's multimodal side (image/video/audio encoders and their buffers).

    Off for text models and for engines without such a rule. On, a derived mem_fraction_static is cut
    (multiplied by `fraction_factor`, or, with the post-capture resize, lowered by `post_capture_cut_mib` of
    the card), `reserve_bytes` come out of the KV budget, and prefill CUDA graphs may be off."""

    on: bool
    why: str
    multimodal_model: bool = False  # whether the engine counts the model as multimodal at all (its side on or off)
    fraction_factor: Fraction | None = None  # None: a derived fraction is not cut (no vision_config to size by)
    post_capture_cut_mib: int = 0
    reserve_bytes: int = 0  # allocated after the KV cache is sized (an embedding cache), so kept out of it
    prefill_cuda_graphs: bool = True  # False: the engine captures none for this model, so reserves none

    def cut_by(self, *, post_capture: bool) -> Literal["post_capture", "factor"] | None:
        """How a derived fraction is cut: by MiB of the card (post-capture resize), by the factor, or not at all."""
        if not self.on:
            return None
        if post_capture:
            return "post_capture"
        return "factor" if self.fraction_factor is not None else None

    def cut_fraction(self, fraction: float, total_bytes: int, *, post_capture: bool) -> float:
        """A derived fraction after the cut (not rounded again, as the engine leaves it; at least
        MIN_DERIVED_FRACTION, where the engine's would reach zero on a small card); unchanged when not cut."""
        how = self.cut_by(post_capture=post_capture)
        if how is None:
            return fraction
        if how == "post_capture":
            cut = exact_fraction(fraction) - Fraction(self.post_capture_cut_mib * MiB, total_bytes)
        else:
            cut = exact_fraction(fraction) * self.fraction_factor  # type: ignore[operator]
        return float(max(MIN_DERIVED_FRACTION, cut))

    def to_dict(self) -> dict[str, Any]:
        """--json's view: the switch, why, the factor (a float; None when not cut) and the reserve in bytes."""
        return {"on": self.on, "why": self.why, "multimodal_model": self.multimodal_model,
                "fraction_factor": None if self.fraction_factor is None else float(self.fraction_factor),
                "post_capture_cut_mib": self.post_capture_cut_mib, "reserve_bytes": self.reserve_bytes,
                "prefill_cuda_graphs": self.prefill_cuda_graphs}


class EngineRules(ABC):
    """One engine version's rules. Subclasses set `name` (the --engine value), `title` and `version`."""

    name: ClassVar[str]
    title: ClassVar[str]
    version: ClassVar[str]
    below_one_request: ClassVar[BelowOneRequest] = "refuse"  # a pool shorter than one full-context request
    plans_pools: ClassVar[bool] = True  # False: the engine's answer is its own (vLLM's blocks), not these pools
    minimums: ClassVar[StartupMinimums] = StartupMinimums()  # what its start-up checks refuse below

    @property
    def label(self) -> str:
        """'SGLang 0.5.23': what the report names."""
        return f"{self.title} {self.version}"

    def window_pools(self, model: ModelConfig, switch: HybridSwaMemory) -> WindowPools:
        """Sliding-window layers in pools of their own unless --disable-hybrid-swa-memory says otherwise."""
        if switch == "disable":
            return WindowPools(separate=False, why="--disable-hybrid-swa-memory")
        return WindowPools(separate=True, why=f"{self.label} sizes sliding-window layers apart")

    def multimodal(self, model: ModelConfig, *, enable_multimodal: bool | None,
                   language_model_only: bool) -> MultimodalMemory:
        """What this engine keeps back for the model's multimodal side: nothing unless an engine says so."""
        return MultimodalMemory(on=False, why=f"{self.label} has no multimodal memory rule here")

    def own_token_count(self, plan: MemoryPoolConfig, settings: SizingSettings) -> int | None:
        """The KV tokens the engine itself would report for this budget, where its rule differs from the plan's and
        is known here; None otherwise."""
        return None

    def no_prefill_graphs_reason(self, model: ModelConfig) -> str:
        """Why the engine captures no prefill CUDA graphs for this model, so reserves none ("" where it does)."""
        return ""

    def served_model(self, model: ModelConfig, *, enable_multimodal: bool | None,
                     language_model_only: bool) -> ModelConfig:
        """The model as this engine builds it (the weights it loads): as read, unless an engine says otherwise."""
        return model

    def config_notes(self, model: ModelConfig) -> tuple[str, ...]:
        """What the engine says of the config file itself (a form it refuses to load): nothing by default."""
        return ()

    def request_table_width(self, context_length: int, settings: SizingSettings) -> int:
        """Token slots per request-table row: the context, plus what one verify step writes past it."""
        return context_length + settings.speculative_num_draft_tokens

    def startup_refusal(self, context_length: int, settings: SizingSettings,
                        default_chunk: int | None = None) -> str | None:
        """Why the engine would refuse to start with these settings before sizing anything (one line naming the
        flag and a value it starts with), or None; `default_chunk`: the card's default prefill chunk, if on one."""
        least = self.minimums.context_length
        if context_length < least:
            return (f"--context-length {context_length} is below the {least} tokens {self.label} starts with; "
                    f"use --context-length {least} or more")
        return None

    def draft_charged_bytes_per_token(self, *, target: tuple[int, int], draft: tuple[int, int],
                                      kinds: tuple[str, ...]) -> int | None:
        """What the engine charges its budget a token for a draft's pool, where more than the pool holds; None
        where it charges what the pool holds (the default). `target` and `draft` are (KV layers, bytes a token) of
        this rank's pools, `kinds` the pool kinds of both."""
        return None

    def plan_notes(self, plan: MemoryPoolConfig) -> tuple[str, ...]:
        """What the report says of a plan under this engine's rules (budget it charges and leaves unused)."""
        return ()

    def kv_dtype_notes(self, model: ModelConfig, *, kv_cache_dtype: str, model_dtype: str) -> tuple[str, ...]:
        """A --kv-cache-dtype other than the model's for a model with no per-token KV (a pure state-space model):
        SGLang 0.5.23 and vLLM 0.34.0 both accept the flag and it sizes nothing, so say so rather than refuse."""
        if model.kv_layer_count or kv_cache_dtype == model_dtype:
            return ()
        return (f"--kv-cache-dtype {kv_cache_dtype} sizes nothing for {model.name}: it has no per-token KV (every "
                f"layer is recurrent state, which keeps its own dtypes); {self.label} accepts the flag and runs as without it",)

    def plan(self, request: PlanRequest) -> MemoryPoolConfig:
        """The pools for a budget: the project's planner unless an engine sizes them its own way."""
        return plan_pool_sizes(request)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label})"
