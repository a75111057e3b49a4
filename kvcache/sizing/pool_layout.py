"""CacheLayout: a rank's cached layers grouped into the pools that will hold them.

Layers of one pool kind (full, swa, mla, state) share one pool and must share one
shape. A sliding-window pool is sized by swa_full_tokens_ratio only when a full pool
beside it holds every token; with every layer sliding it holds every token itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from fractions import Fraction

from kvcache.inputs.dtypes import STATE_DTYPES, DType, KVCacheDtype
from kvcache.errors import ConfigError, UnsupportedModelError
from kvcache.sizing.layer_specs import LayerPlacement, RecurrentStateSpec, SlidingWindowSpec, TokenSpec, model_layer_specs
from kvcache.models.model_config import KV_LAYER_KINDS, ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_arg_types import HybridSwaMemory
from kvcache.sizing.engine_rules import EngineRules
from kvcache.sizing.plan_request import KVPoolDemand, StateDemand
from kvcache.sizing.pool_config import DRAFT_POOL_PREFIX


@dataclass(frozen=True, slots=True)
class KVPoolGroup:
    """The layers of one per-token pool, their common spec, and how the pool is sized."""

    name: str
    spec: TokenSpec
    layer_ids: tuple[int, ...]
    paired_with_full: bool

    @property
    def bytes_per_token(self) -> int:
        return self.spec.bytes_per_token * len(self.layer_ids)

    def demand(self) -> KVPoolDemand:
        window = self.spec.window if isinstance(self.spec, SlidingWindowSpec) else None
        return KVPoolDemand(
            name=self.name, kind=self.spec.pool_kind, num_layers=len(self.layer_ids),
            bytes_per_token=self.bytes_per_token, window=window,
            share="swa" if self.paired_with_full else "all", layer_ids=self.layer_ids, row=self.spec.row_tensors(),
        )


@dataclass(frozen=True, slots=True)
class StateGroup:
    """The recurrent-state layers of a hybrid model; one slot holds all of them."""

    spec: RecurrentStateSpec
    layer_ids: tuple[int, ...]

    @property
    def bytes_per_slot(self) -> int:
        return self.spec.bytes_per_request * len(self.layer_ids)

    def demand(self, *, slots_per_request: int, memory_ratio: Fraction, max_slots: int | None) -> StateDemand:
        return StateDemand(
            num_layers=len(self.layer_ids), bytes_per_slot=self.bytes_per_slot,
            slots_per_request=slots_per_request, memory_ratio=memory_ratio, max_slots=max_slots,
            layer_ids=self.layer_ids, slot=self.spec.slot_tensors(),
        )


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """Per-token pool groups and the optional state group of one worker."""

    kv_groups: tuple[KVPoolGroup, ...]
    state: StateGroup | None = None

    @classmethod
    def from_placements(cls, placements: Sequence[LayerPlacement], *, prefix: str = "") -> "CacheLayout":
        by_kind: dict[str, list[LayerPlacement]] = {}
        for p in placements:
            by_kind.setdefault(p.spec.pool_kind, []).append(p)
        has_full = bool(by_kind.get("full") or by_kind.get("mla"))
        groups: list[KVPoolGroup] = []
        for kind in ("full", "mla", "swa"):
            members = by_kind.get(kind)
            if not members:
                continue
            spec = _uniform(kind, members)
            groups.append(KVPoolGroup(
                name=prefix + kind, spec=spec, layer_ids=tuple(m.layer_id for m in members),
                paired_with_full=(kind == "swa" and has_full),
            ))
        state = None
        if by_kind.get("state"):
            members = by_kind["state"]
            state = StateGroup(spec=_uniform("state", members), layer_ids=tuple(m.layer_id for m in members))
        return cls(kv_groups=tuple(groups), state=state)

    def with_kv_dtype(self, dtype: KVCacheDtype) -> "CacheLayout":
        """The same layers cached in another KV dtype (for 'what if FP8' advice)."""
        groups = tuple(replace(g, spec=replace(g.spec, dtype=dtype)) for g in self.kv_groups)
        return CacheLayout(kv_groups=groups, state=self.state)

    def group(self, name: str) -> KVPoolGroup:
        for g in self.kv_groups:
            if g.name == name:
                return g
        raise KeyError(name)


def _uniform(kind: str, members: list[LayerPlacement]):  # type: ignore[no-untyped-def]
    specs = {m.spec for m in members}
    if len(specs) > 1:
        raise UnsupportedModelError(
            f"{kind} layers of different shapes ({len(specs)} kinds) cannot share one pool; "
            "this model needs a pool per shape, which is not supported yet"
        )
    return members[0].spec


def worker_cache_layout(
    *, model_config: ModelConfig, parallel_state: ParallelState, kv_cache_dtype: KVCacheDtype,
    model_dtype: DType, mamba_ssm_dtype: str = "float32", layer_ids: range | None = None, prefix: str = "",
    window_pools: bool = True,
) -> CacheLayout:
    """One worker's pools: its layer specs (this rank's layers), grouped; sliding layers in a pool of their own
    only with `window_pools` (the engine's rule, EngineRules.window_pools)."""
    placements = model_layer_specs(
        model_config, parallel_state, kv_cache_dtype, model_dtype=model_dtype,
        ssm_dtype=STATE_DTYPES[mamba_ssm_dtype], layer_ids=layer_ids, window_pools=window_pools,
    )
    layout = CacheLayout.from_placements(placements, prefix=prefix)
    if not layout.kv_groups and not is_pure_state_space(model_config):  # a hybrid's stage without attention
        raise _without_attention(model_config, parallel_state, layer_ids)
    return layout


def is_pure_state_space(m: ModelConfig) -> bool:
    """A model without any attention layer, only recurrent state (Mamba, Mamba-2, an all-Mamba Granite-4): its
    engines hold state slots and a token pool of no bytes (kvcache.sizing.planning.zero_kv_tokens)."""
    return not any(kind in KV_LAYER_KINDS for kind in m.layer_kinds)


def _without_attention(m: ModelConfig, p: ParallelState, layer_ids: range | None) -> ConfigError:
    """The refusal for a stage (or a model) whose layers hold recurrent state but no per-token KV."""
    n = len(m.layer_kinds)

    def attends(ids: range) -> bool:
        return any(m.layer_kinds[i] in KV_LAYER_KINDS for i in ids)

    stage = layer_ids if layer_ids is not None else p.layer_range(n)
    working = [str(k) for k in range(1, n + 1)
               if all(attends(ParallelState(pp_size=k, pp_rank=r).layer_range(n)) for r in range(k))]
    listed = working[0] if len(working) == 1 else f"{', '.join(working[:-1])} or {working[-1]}"
    return ConfigError(
        f"{m.name}: pipeline stage {p.pp_rank} of --pp-size {p.pp_size} (layers {stage.start}-{stage.stop - 1}) has "
        f"no attention layer, only recurrent state, and every stage needs one for its per-token KV: use --pp-size {listed}"
    )


def draft_cache_layout(
    draft_model_config: ModelConfig | None, *, parallel_state: ParallelState, kv_cache_dtype: KVCacheDtype,
    model_dtype: DType, mamba_ssm_dtype: str = "float32", engine: EngineRules,
    hybrid_swa_memory: HybridSwaMemory = "auto",
) -> CacheLayout | None:
    """The draft worker's pools, named with DRAFT_POOL_PREFIX, as its target pays for them; None without a draft."""
    if draft_model_config is None:
        return None
    return worker_cache_layout(
        model_config=draft_model_config, parallel_state=parallel_state, kv_cache_dtype=kv_cache_dtype,
        model_dtype=model_dtype, mamba_ssm_dtype=mamba_ssm_dtype, prefix=DRAFT_POOL_PREFIX,
        window_pools=engine.window_pools(draft_model_config, hybrid_swa_memory).separate,
    )
