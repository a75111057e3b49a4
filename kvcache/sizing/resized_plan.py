"""A plan re-planned for a new budget: the planner's input that produced it, with its sizes as caps.

The post-capture resize, measured headroom and a dry run's prediction of it all re-plan this way.
"""

from __future__ import annotations

import msgspec

from kvcache.sizing.planning import plan_pool_sizes

from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest
from kvcache.sizing.pool_config import MemoryPoolConfig


def resized_plan_request(plan: MemoryPoolConfig, budget_bytes: int) -> PlanRequest:
    """The planner's input that produced `plan`, with a new budget and `plan`'s sizes as caps."""
    demands = []
    for p in plan.kv_pools:
        if not p.holds_every_token:
            raise ValueError(f"pool {p.name!r} holds a window of tokens; only pools that hold every token are resized")
        demands.append(KVPoolDemand(name=p.name, kind=p.kind, num_layers=p.num_layers, bytes_per_token=p.bytes_per_token,
                                    layer_ids=p.layer_ids, row=p.row, charged_bytes_per_token=p.charged_bytes_per_token))
    if plan.state_pool is not None:
        raise ValueError("a plan with a recurrent-state pool is not resized")
    budget = msgspec.structs.replace(plan.budget, budget_bytes=budget_bytes)
    return PlanRequest(
        budget=budget, page_size=plan.page_size, context_length=plan.context_length,
        req_to_token_row_width=plan.req_to_token_row_width, kv_pools=tuple(demands),
        max_total_tokens=plan.max_total_num_tokens, max_running_requests=plan.max_running_requests,
        below_one_request=plan.below_one_request,  # the planner's: a capped plan stays one, a full one stays full
        request_table_requests=plan.table_requests,  # the table is not resized: its rows stay charged
    )


def built_rows_plan(built: MemoryPoolConfig, static: MemoryPoolConfig, at_most_tokens: int) -> MemoryPoolConfig:
    """`static` (SGLang's static plan, say) as `built`'s pools hold it, at most `at_most_tokens`: the request table
    is not resized, so its rows beyond `static`'s are added to `static`'s budget, and the tokens stay `static`'s.
    `static` was planned, so the engine runs a plan of its size; `at_most_tokens` may be another rank's such plan,
    so one below a full-context request caps each request whatever `built`'s rule."""
    as_held = msgspec.structs.replace(static, request_table_requests=built.table_requests)
    extra_rows = max(0, as_held.total_bytes - static.total_bytes)  # the rows and what the arena's rounding adds
    budget = msgspec.structs.replace(static.budget, budget_bytes=static.budget.budget_bytes + extra_rows)
    request = resized_plan_request(built, budget.budget_bytes)
    return plan_pool_sizes(msgspec.structs.replace(request, budget=budget, max_total_tokens=at_most_tokens,
                                                   below_one_request="cap"))
