"""Which larger --tp-size would let weights that do not fit load, checked by planning at that size.

A size is offered when this worker's KV cache plans with it (weights per rank from `weights_for`, the
card's first-allocation growth charged); failing that, the smallest size whose weights still leave
the runtime reserve the fraction keeps (the weights alone: the KV cache then needs more).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import msgspec

from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.layer_specs import tensor_parallel_sizes
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory


class TensorParallelFit(msgspec.Struct, frozen=True, kw_only=True):
    """A --tp-size to suggest: the weights one rank then holds, and whether the KV cache plans with it too."""

    tp_size: int
    weights_bytes: int
    kv_cache_plans: bool
    request_token_cap: int | None = None  # the KV cache plans, each request capped below the context (SGLang runs so)


def tp_size_that_fits(sizing: WorkerSizing, *, free_before_load: int, total_bytes: int, device_capacity_bytes: int,
                      weights_for: Callable[[ParallelState], int], context_growth: int,
                      check_kv_cache: bool, draft: WorkerSizing | None = None) -> TensorParallelFit | None:
    """The smallest attention-TP multiple above the current --tp-size (heads must split) with which this worker
    plans; else the smallest whose weights leave the runtime reserve free. `check_kv_cache=False` (a draft,
    which follows its target's plan) checks the weights alone. A target paying for a `draft`'s pools pays for them
    as that size splits them (the draft worker's own layout there), as `plan` at that size does."""
    parallel = sizing.parallel_state
    weights_alone: TensorParallelFit | None = None
    for attention_tp in tensor_parallel_sizes(sizing.model_config):
        tp = attention_tp * parallel.attention_dp_size
        if tp <= parallel.tp_size:
            continue
        state = replace(parallel, tp_size=tp, tp_rank=0, groups=None)
        weights = weights_for(state)
        if weights > free_before_load:
            continue
        at_tp = replace(sizing, parallel_state=state)
        if draft is not None:
            at_tp = replace(at_tp, draft_layout=replace(draft, parallel_state=state).layout())
        after = max(0, free_before_load - weights - context_growth)
        memory = WorkerMemory(total_bytes=total_bytes, free_before_load=free_before_load, free_after_load=after,
                              reported_total_bytes=device_capacity_bytes)
        plan = at_tp.plan_or_none(memory) if check_kv_cache else None
        if plan is not None:
            return TensorParallelFit(tp_size=tp, weights_bytes=weights, kv_cache_plans=True,
                                     request_token_cap=plan.request_token_cap)
        if weights_alone is None and at_tp.budget_for(memory)(at_tp.mem_fraction_static(device_capacity_bytes)) > 0:
            weights_alone = TensorParallelFit(tp_size=tp, weights_bytes=weights, kv_cache_plans=not check_kv_cache)
    return weights_alone
