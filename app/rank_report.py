"""Every rank's plan in one report: rank 0 gathers them and prints; the other ranks print nothing.

With one process the report is exactly the single-rank report. With several, each
rank contributes a RankPlan (its layers, bytes per token, tokens, bytes planned and
allocated, free memory now) and rank 0 appends them: as a `ranks` table in text, as
a `ranks` list in --json.
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.report import BootstrapReport
from app.started_worker import StartedEngine
from app.report_text import render_text
from kvcache.byte_units import format_bytes


class RankPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's share of the engine, as rank 0 prints it."""

    rank: int
    name: str
    layers: tuple[int, int]  # [first, last + 1) of this pipeline stage
    bytes_per_token: int
    max_total_num_tokens: int  # what the ranks agreed on: the smallest rank's
    own_max_total_num_tokens: int  # what this rank's memory alone would hold, as built (a resize keeps it)
    max_running_requests: int
    budget_bytes: int
    planned_bytes: int
    allocated_bytes: int  # held now (KVCacheConfigResult.allocated_bytes): after a resize, its mapped bytes
    weights_bytes: int
    free_before_load_bytes: int  # this rank's own reading (the plan uses the ranks' smallest)
    free_after_load_bytes: int  # this rank's own, after its own weights (the plan uses the ranks' smallest)
    free_now_bytes: int  # after bootstrap: what the runtime has left on this rank
    memory_allocated_bytes: int | None  # torch.cuda.memory_allocated on this rank's GPU (CUDA only)
    headline_tokens: int  # what this rank's report leads with (a dry run's measured prediction, or its plan)
    state_bytes_per_request: int | None = None  # a rank without per-token KV (a pure state-space model): its state
    engine_own_tokens: int | None = None  # what the engine itself would size on this rank alone (report's, if known)


def rank_plan(engine: StartedEngine, report: BootstrapReport) -> RankPlan:
    """This rank's RankPlan (`report`: this rank's own report)."""
    target = engine.target
    p = target.parallel_state
    plan = target.memory_pool_config
    layers = p.layer_range(target.model_config.num_hidden_layers)
    return RankPlan(
        rank=p.rank, name=p.describe(), layers=(layers.start, layers.stop), bytes_per_token=plan.bytes_per_token,
        max_total_num_tokens=plan.max_total_num_tokens, own_max_total_num_tokens=target.kv_cache.own_max_total_num_tokens,
        max_running_requests=plan.max_running_requests, budget_bytes=plan.budget.budget_bytes, planned_bytes=plan.total_bytes, allocated_bytes=sum(w.kv_cache.allocated_bytes for w in engine.workers),
        weights_bytes=sum(w.weights.total_bytes for w in engine.workers if w.weights is not None),
        free_before_load_bytes=target.pre_model_load_memory or 0,
        free_after_load_bytes=target.kv_cache.own_memory.free_after_load, free_now_bytes=target.memory_probe.free_bytes(),
        memory_allocated_bytes=_memory_allocated(target.device),
        headline_tokens=report.max_total_num_tokens,
        state_bytes_per_request=None if plan.kv_pools else report.state_bytes_per_request,
        engine_own_tokens=report.engine_own_tokens,
    )


def _memory_allocated(device: Any) -> int | None:
    """torch.cuda.memory_allocated on a CUDA rank's GPU; None elsewhere (torch is imported only for a CUDA rank)."""
    if device.type != "cuda":
        return None
    import torch

    return int(torch.cuda.memory_allocated(device))


def _cache_of(r: RankPlan) -> str:
    """What a rank's cache costs: bytes a token, or, without per-token KV, its state a request."""
    if r.state_bytes_per_request is not None:
        return f"state {format_bytes(r.state_bytes_per_request)} a request"
    return f"{r.bytes_per_token:,} B/token"


def agreed_headline(report: BootstrapReport, plans: list[RankPlan]) -> BootstrapReport:
    """Rank 0's report leading with what every rank will hold: the smallest rank's headline. A dry run's
    prediction is each stage's own (its layers, its steps), and measured ranks keep the smallest resized count
    (kvcache.runtime.agreed_resize), so stage 0's own prediction alone could promise more than the stages agree on.
    The engine's own count is the smallest rank's too (SGLang 0.5.23 MIN-reduces max_total_num_tokens over its
    ranks), and unknown where any rank's is."""
    own = [r.engine_own_tokens for r in plans]
    report = msgspec.structs.replace(report, engine_own_tokens=None if None in own else min(own))  # type: ignore[type-var]
    agreed = min(r.headline_tokens for r in plans)
    if agreed == report.max_total_num_tokens:
        return report
    prediction = report.measured_prediction
    return msgspec.structs.replace(report, max_total_num_tokens=agreed, measured_prediction=None if prediction is None
                                   else {**prediction, "tokens": agreed})


def render_for_this_rank(engine: StartedEngine, report: BootstrapReport, *, as_json: bool) -> str | None:
    """What this rank prints: the report (with every rank's plan on rank 0), or None on the other ranks.
    A collective when there are several ranks: every rank must call it. A dry run's pipeline stages
    (app.stage_plans: one thread per stage) list as `stages`."""
    p = engine.target.parallel_state
    if not p.is_distributed:
        return msgspec.json.encode(report).decode() if as_json else render_text(report)
    agreement = p.agreement
    plans = agreement.gather_objects(rank_plan(engine, report))
    if agreement.rank != 0:
        return None
    report = agreed_headline(report, plans)
    key = "stages" if getattr(p.groups.agreement if p.groups else None, "one_rank_per_stage", False) else "ranks"
    if as_json:
        return msgspec.json.encode({**msgspec.structs.asdict(report), key: plans}).decode()
    table = render_stages(plans, tp_size=p.tp_size) if key == "stages" else render_ranks(plans, tp_size=p.tp_size, pp_size=p.pp_size)
    return render_text(report) + "\n" + table


def render_ranks(plans: list[RankPlan], *, tp_size: int, pp_size: int) -> str:
    """One line per rank: where it sits, what it holds, what it allocated and has left."""
    tokens = {r.max_total_num_tokens for r in plans}
    agreed = f"every rank holds {plans[0].max_total_num_tokens:,} tokens" if len(tokens) == 1 else \
        f"ranks disagree on tokens: {sorted(tokens)}"
    lines = [f"ranks: tp {tp_size} x pp {pp_size}; {agreed}"]
    for r in plans:
        lines.append(
            f"  {r.name}  layers {r.layers[0]}-{r.layers[1] - 1}  {_cache_of(r)}  "
            f"planned {format_bytes(r.planned_bytes)}  allocated {format_bytes(r.allocated_bytes)}  "
            f"weights {format_bytes(r.weights_bytes)}  free now {format_bytes(r.free_now_bytes)}"
            + (f"  memory_allocated {format_bytes(r.memory_allocated_bytes)}" if r.memory_allocated_bytes is not None else "")
        )
    return "\n".join(lines)


def render_stages(plans: list[RankPlan], *, tp_size: int) -> str:
    """A dry run's pipeline stages: what each would hold alone, what they agree on, and the budget it leaves idle."""
    smallest = min(plans, key=lambda r: r.own_max_total_num_tokens)
    agreed = plans[0].max_total_num_tokens
    stage_of = {r.rank: s for s, r in enumerate(plans)}
    tightest = min(plans, key=lambda r: r.free_after_load_bytes)
    lines = [f"stages: pp {len(plans)}" + (f" (each stage's {tp_size} TP ranks hold the same)" if tp_size > 1 else "")
             + f"; each stage plans with the ranks' smallest free memory after load (stage "
             f"{stage_of[tightest.rank]}'s, as SGLang 0.5.23 takes the MIN over every rank), then every rank holds "
             f"the smallest stage's {agreed:,} tokens (stage {stage_of[smallest.rank]}); the report above is stage 0's"]
    for s, r in enumerate(plans):
        idle = r.budget_bytes - r.planned_bytes
        lines.append(
            f"  stage {s}  layers {r.layers[0]}-{r.layers[1] - 1}  {_cache_of(r)}  "
            f"weights {format_bytes(r.weights_bytes)}  free after load {format_bytes(r.free_after_load_bytes)}  "
            f"own plan {r.own_max_total_num_tokens:,} tokens  "
            f"planned {format_bytes(r.planned_bytes)}  idle {format_bytes(idle)}"
        )
    return "\n".join(lines)
