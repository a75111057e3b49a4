"""Pools built alone (tests): their part of a plan, planned from a layer spec as the planner plans it."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import torch

from kvcache.pools import MHATokenToKVPool, MLATokenToKVPool
from kvcache.pools.builder import kv_pool
from kvcache.pools.planned_views import Views
from kvcache.sizing.layer_specs import RecurrentStateSpec, TokenSpec
from kvcache.sizing.pool_config import KVPoolPlan, StatePoolPlan
from kvcache.sizing.pool_layout import KVPoolGroup, StateGroup


def kv_pool_plan(spec: TokenSpec, *, tokens: int, page_size: int = 1, layer_ids: Sequence[int] = (0,),
                 name: str | None = None) -> KVPoolPlan:
    """A per-token pool of `tokens` tokens (plus the padding page) over `layer_ids`, named by its kind unless
    `name` is given: the KVPoolPlan the planner would make for these layers (KVPoolDemand.sized)."""
    group = KVPoolGroup(name=name or spec.pool_kind, spec=spec, layer_ids=tuple(layer_ids), paired_with_full=False)
    return group.demand().sized(tokens, page_size)


def state_pool_plan(spec: RecurrentStateSpec, *, num_slots: int, layer_ids: Sequence[int] = (0,),
                    slots_per_request: int = 1) -> StatePoolPlan:
    """A recurrent-state pool of `num_slots` slots (padding slot included) over `layer_ids` (StateDemand.sized)."""
    group = StateGroup(spec=spec, layer_ids=tuple(layer_ids))
    return group.demand(slots_per_request=slots_per_request, memory_ratio=Fraction(1), max_slots=None).sized(num_slots)


def standalone_kv_pool(spec: TokenSpec, *, tokens: int, page_size: int = 1, layer_ids: Sequence[int] = (0,),
                       device: torch.device | str = "cpu", views: Views | None = None) -> MHATokenToKVPool | MLATokenToKVPool:
    """The MHA or MLA pool of kv_pool_plan(spec, ...), on `views` or an arena of its own."""
    plan = kv_pool_plan(spec, tokens=tokens, page_size=page_size, layer_ids=layer_ids)
    return kv_pool(plan, spec, device=torch.device(device), views=views)
