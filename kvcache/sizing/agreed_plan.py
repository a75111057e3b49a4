"""A worker's plan as the ranks of one engine agree on it, and a draft's check that it can share its target's.

SGLang 0.5.23 plans every rank with the smallest free memory over the ranks, then every rank holds the smallest
rank's tokens. Pure (the ranks' collectives are kvcache.inputs.rank_agreement's), so the configurator, which then
builds the plan, and a dry run (app.dry_run), which builds nothing, agree alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.errors import ConfigError
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.pool_layout import CacheLayout
from kvcache.sizing.worker_memory import WorkerMemory
from kvcache.sizing.worker_sizing import WorkerSizing


@dataclass(frozen=True, slots=True)
class AgreedPlan:
    """The plan every rank holds, what this rank's own plan held before they agreed, and this rank's readings."""

    plan: MemoryPoolConfig
    own_tokens: int
    own_memory: WorkerMemory


def plan_as_the_ranks_agree(sizing: WorkerSizing, own: WorkerMemory, ranks: RankAgreement) -> AgreedPlan:
    """Plan with the ranks' smallest readings; a rank whose plan holds more than the smallest rank's tokens plans
    again capped at them. Every step runs on every rank: all succeed, or all raise the same error."""
    agreed = ranks.agree_on_memory(free_before_load=own.free_before_load, free_after_load=own.free_after_load,
                                   total_bytes=own.total_bytes, device_capacity_bytes=own.device_capacity_bytes)
    memory = WorkerMemory(total_bytes=agreed.total, free_before_load=agreed.free_before_load,
                          free_after_load=agreed.free_after_load, reported_total_bytes=agreed.device_capacity)
    plan = ranks.run_everywhere(lambda: sizing.plan(memory))
    (tokens,) = ranks.min_int64((plan.max_total_num_tokens,))
    capped = ranks.run_everywhere(  # every rank, re-planning or not
        lambda: plan if plan.max_total_num_tokens <= tokens else sizing.plan(memory, at_most_tokens=tokens))
    return AgreedPlan(plan=capped, own_tokens=plan.max_total_num_tokens, own_memory=own)


def check_draft_shares(plan: MemoryPoolConfig, layout: CacheLayout) -> None:
    """A draft worker of `layout` can use its target's `plan`: each of its pools was paid for at its own bytes per
    token, and it holds no recurrent state (the request table it would share has no state slots for it)."""
    for group in layout.kv_groups:
        try:
            pool_plan = plan.pool(group.name)
        except KeyError:
            raise ConfigError(
                f"the target's plan has no pool {group.name!r} for this draft worker (it has "
                f"{[p.name for p in plan.kv_pools]}): the target must be configured with this draft's layout"
            ) from None
        if pool_plan.bytes_per_token != group.bytes_per_token:
            raise ConfigError(
                f"draft pool {group.name!r} costs {group.bytes_per_token} bytes/token but the target paid for "
                f"{pool_plan.bytes_per_token}: target and draft were configured with different settings"
            )
    if layout.state is not None:
        raise ConfigError("a draft worker with recurrent-state layers cannot share the target's request table")
