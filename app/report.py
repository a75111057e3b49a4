"""The bootstrap report: what was sized and built (or, for a dry run, planned), as text for people or one JSON
object."""

from __future__ import annotations

from typing import Any

import msgspec

from app.started_worker import StartedEngine, StartedWorker
from kvcache.engines import EngineRules
from kvcache.inputs.cards import KNOWN_CARDS
from kvcache.sizing.memory_budget import MemoryBudget, headroom_bytes
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.capacity_notes import CapacityNote, capacity_notes
from kvcache.sizing.worker_memory import WorkerMemory


class WorkerReport(msgspec.Struct, frozen=True, kw_only=True):
    """One worker: its model, formats, what it allocated and how long each phase took."""

    role: str
    model: str
    model_dtype: str
    kv_cache_dtype: str
    weights_bytes: int
    parameter_count: int
    allocated_bytes: int  # held now (KVCacheConfigResult.allocated_bytes), after any live resize
    pools: list[str]
    timings_s: dict[str, float]


class BootstrapReport(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's outcome. Keys are stable: scripts read them from --json."""

    model: str
    engine: str  # the --engine whose rules the plan follows ("sglang")
    engine_version: str  # the version of that engine the rules cite ("0.5.23")
    device: str
    card: str | None
    model_dtype: str
    kv_cache_dtype: str
    page_size: int
    page_size_note: str | None  # why the page size is not --page-size's (a DSA model pages at 64)
    context_length: int
    bytes_per_token: int | None  # None: a pure state-space model holds no per-token KV (state_bytes_per_request)
    max_total_num_tokens: int  # the headline: what a bootstrap with these flags on that card will hold
    max_total_num_tokens_source: str  # static_plan, measured (this bootstrap measured), prediction_<basis> (a dry run)
    static_plan_tokens: int  # SGLang's static plan (its fraction's budget): what --kv-headroom fraction holds
    request_token_cap: int | None  # tokens one request may hold where the pool is shorter than the context, else None
    max_running_requests: int
    budget_bytes: int
    mem_fraction_static: float | None
    free_before_load_bytes: int  # this rank's own readings, beside its own weights
    free_after_load_bytes: int
    total_memory_bytes: int  # cudaMemGetInfo's total (the budget's free memory comes from it)
    weights_bytes: int
    vision_weights: str  # "none", "counted", "not_counted" (the config lacks its shapes) or "not_loaded" (not built)
    buffers: dict[str, int]
    planned_bytes: int  # the plan the pools hold now: after a live resize, the resized one's
    allocated_bytes: int  # held now: after a live resize, the arena's mapped bytes and the fresh allocator's lists
    plan: dict[str, Any]
    state_request_cap: int | None
    timings_s: dict[str, float]
    capacity_notes: list[CapacityNote]  # caps that leave part of the pool unusable by running requests
    engine_notes: list[str]  # what the engine does otherwise for this model (a form it refuses to load; no prefill graphs)
    draft: WorkerReport | None = None
    measured_headroom: dict[str, Any] | None = None  # kvcache.runtime.measured_headroom.MeasuredSizing.to_dict()
    measured_prediction: dict[str, Any] | None = None  # a dry run: what a measured bootstrap on the card will hold
    measured_off: str | None = None  # a dry run asking for measured headroom that the card's start would not measure: why
    engine_own_tokens: int | None = None  # what the engine itself would size for this budget, where that is known
    multimodal: dict[str, Any] | None = None  # the engine's multimodal memory rule and what it kept (_multimodal)
    # Where ranks agreed on less than this rank's own readings: the smallest over the ranks, which the budget reads
    # (SGLang 0.5.23's MIN over every rank, pipeline stages included); None when they are this rank's
    ranks_smallest_memory: dict[str, int] | None = None
    state_bytes_per_request: int | None = None  # a state pool's bytes for one running request (its slots, all layers)
    # the card as SGLang's get_device_memory_capacity reads it (nvidia-smi's total), which its derived fraction is for
    device_capacity_bytes: int | None = None
    card_total_measured: bool | None = None  # a named card: False where nvidia-smi's total stands in for cudaMemGetInfo's


def _worker(runner: StartedWorker) -> WorkerReport:
    kv = runner.kv_cache
    assert runner.weights is not None
    return WorkerReport(
        role=runner.role, model=runner.model_config.name, model_dtype=kv.model_dtype.name,
        kv_cache_dtype=kv.kv_cache_dtype.name, weights_bytes=runner.weights.total_bytes,
        parameter_count=runner.weights.parameter_count, allocated_bytes=kv.allocated_bytes,
        pools=_pool_names(runner), timings_s=dict(runner.timings),
    )


def _pool_names(runner: StartedWorker) -> list[str]:
    plan = runner.memory_pool_config
    return [p.name for p in plan.kv_pools if p.of_draft_worker == (runner.role == "draft")]


def build_report(engine: StartedEngine, *, rules: EngineRules, card: str | None = None,
                 page_size_note: str | None = None) -> BootstrapReport:
    target = engine.target
    kv = target.kv_cache
    plan = kv.memory_pool_config
    budget = plan.budget
    assert target.weights is not None
    weights = sum(w.weights.total_bytes for w in engine.workers if w.weights is not None)
    measured = target.measured_sizing.to_dict() if target.measured_sizing is not None else None
    prediction, predicted_plan = _prediction(target, card)
    held = plan  # the pools the headline's bootstrap holds: the predicted plan where the prediction moves it
    if predicted_plan is not None and predicted_plan.max_total_num_tokens != plan.max_total_num_tokens:
        held = predicted_plan
    headline, source, static = _headline(plan.max_total_num_tokens, measured, prediction)
    return BootstrapReport(
        model=target.model_config.name, engine=rules.name, engine_version=rules.version,
        device=str(target.device), card=card,
        model_dtype=kv.model_dtype.name, kv_cache_dtype=kv.kv_cache_dtype.name,
        page_size=plan.page_size, page_size_note=page_size_note, context_length=plan.context_length,
        bytes_per_token=plan.bytes_per_token if plan.kv_pools else None,
        max_total_num_tokens=headline, max_total_num_tokens_source=source, static_plan_tokens=static,
        request_token_cap=held.request_token_cap,
        max_running_requests=plan.max_running_requests, budget_bytes=budget.budget_bytes, mem_fraction_static=budget.mem_fraction_static,
        free_before_load_bytes=kv.own_memory.free_before_load, free_after_load_bytes=kv.own_memory.free_after_load,
        total_memory_bytes=budget.total_bytes, weights_bytes=weights,
        vision_weights=target.model_config.vision_weights, buffers=plan.buffers,
        planned_bytes=plan.total_bytes, allocated_bytes=sum(w.kv_cache.allocated_bytes for w in engine.workers),
        plan=plan.to_dict(),
        state_request_cap=plan.state_pool.request_cap if plan.state_pool else None,
        timings_s=dict(target.timings), capacity_notes=list(capacity_notes(target.sizing, held)),
        engine_notes=[*rules.config_notes(target.model_config), *rules.plan_notes(plan),
                      *rules.kv_dtype_notes(target.model_config, kv_cache_dtype=kv.kv_cache_dtype.name,
                                            model_dtype=kv.model_dtype.name),
                      *filter(None, [rules.no_prefill_graphs_reason(target.model_config)])],
        draft=_worker(engine.draft) if engine.draft is not None else None,
        measured_headroom=measured, measured_prediction=prediction,
        measured_off=_measured_off(target, card),
        engine_own_tokens=rules.own_token_count(plan, target.sizing.settings),
        multimodal=_multimodal(target),
        ranks_smallest_memory=_ranks_smallest_memory(kv.own_memory, budget),
        state_bytes_per_request=(plan.state_pool.bytes_per_slot * plan.state_pool.slots_per_request
                                 if plan.state_pool else None),
        device_capacity_bytes=budget.device_capacity_bytes,
        card_total_measured=KNOWN_CARDS[card].cuda_total_measured if card in KNOWN_CARDS else None,
    )


def _headline(planned: int, measured: dict[str, Any] | None,
              prediction: dict[str, Any] | None) -> tuple[int, str, int]:
    """(the tokens a bootstrap with these flags holds, where that number comes from, SGLang's static plan's tokens):
    a bootstrap that measured holds its plan; a dry run whose card would measure, the prediction; else the plan."""
    if measured is not None:
        return planned, "measured", measured["static_tokens"]
    if prediction is not None:
        return prediction["tokens"], f"prediction_{prediction['basis']}", planned
    return planned, "static_plan", planned


def _ranks_smallest_memory(own: WorkerMemory, budget: MemoryBudget) -> dict[str, int] | None:
    """The readings the budget came from where the ranks' smallest is not this rank's own (another stage's
    weights, another card's free memory); None when this rank's are the ones the budget read."""
    agreed = WorkerMemory.of_budget(budget)
    if (agreed.free_before_load, agreed.free_after_load) == (own.free_before_load, own.free_after_load):
        return None
    return {"free_before_load_bytes": agreed.free_before_load, "free_after_load_bytes": agreed.free_after_load}


def _multimodal(target: StartedWorker) -> dict[str, Any]:
    """The engine's multimodal rule for the target and what it kept free: the fraction before and after its cut
    (a derived fraction only), the bytes that cut keeps beyond the uncut fraction, and the budget's reserve."""
    sizing, budget = target.sizing, target.memory_pool_config.budget
    rule = sizing.multimodal()
    out: dict[str, Any] = {**rule.to_dict(), "cut_by": None, "fraction_before_cut": None,
                           "fraction": budget.mem_fraction_static, "kept_by_fraction_bytes": 0,
                           "reserve_bytes": budget.reserved_bytes}  # what the budget kept (none with --kv-cache-memory)
    if rule.on and budget.mem_fraction_static is not None and sizing.settings.mem_fraction_static is None:
        before = sizing.derived_fraction_before_multimodal_cut(budget.device_capacity_bytes)
        out["cut_by"] = rule.cut_by(post_capture=sizing.post_capture_resize().active)
        out["fraction_before_cut"] = before
        out["kept_by_fraction_bytes"] = (headroom_bytes(budget.free_before_load_bytes, budget.mem_fraction_static)
                                         - headroom_bytes(budget.free_before_load_bytes, before))
    return out


def _prediction(target: StartedWorker, card: str | None) -> tuple[dict[str, Any] | None, MemoryPoolConfig | None]:
    """A dry run for a card: the tokens a measured bootstrap (--kv-headroom) there will hold, and its source; and
    the plan it predicts (None for either where the card's start would not measure)."""
    if card is None or target.role != "target":
        return None, None
    from kvcache.sizing.measured_prediction import predict_measured_plan
    from kvcache.sizing.worker_memory import WorkerMemory

    memory = WorkerMemory.of_budget(target.memory_pool_config.budget)
    predicted = predict_measured_plan(sizing=target.configurator_sizing(), memory=memory, card_name=card)
    return (predicted[0].to_dict(), predicted[1]) if predicted is not None else (None, None)


def _measured_off(target: StartedWorker, card: str | None) -> str | None:
    """A dry run for a card whose settings ask for measured headroom (--kv-headroom, auto by default) that its CUDA
    start would not measure: the reason (the fraction then keeps the headroom); None otherwise."""
    if card is None or target.role != "target":
        return None
    import dataclasses

    cuda = dataclasses.replace(target.configurator_sizing(), device_type="cuda")
    eligibility = cuda.post_capture_resize()
    if not cuda.settings.measures_headroom or eligibility.measured:
        return None
    return eligibility.not_measured or eligibility.reason


