"""The operator's question: which card, TP size and KV dtype serve a target, one plan per cell.

A cell is (card, --tp-size, --pp-size, --kv-cache-dtype). Every cell is planned by the planner `plan` uses,
in this process and without torch: app.plan_wiring wires the worker as EngineContainer does for `plan` (page size,
speculative defaults, draft pools, parallel state), the card's FixedMemoryProbe is debited by each worker's
weights as ModelRunner.load_weights debits it, and the configurator's WorkerSizing (kvcache.sizing.worker_sizing,
the one planning entry point) makes the budget and the planner's request for `plan_pool_sizes`. What a dry run
need not do for a yes/no answer is skipped: the weights' and pools' meta tensors, and the advice a refused plan
would search for. One wiring (and one weight count) serves every card of a (TP, PP, KV dtype) combination:
a 96-cell sweep takes well under a second. (Under --engine vllm: app/fit_vllm.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

import msgspec

from app.plan_wiring import planned_workers, single_process_state
from kvcache.errors import ConfigError, DoesNotFitError, KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError
from kvcache.byte_units import GiB
from kvcache.inputs.cards import SimulatedCard
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.measured_prediction import predict_measured_plan
from kvcache.sizing.planning import plan_pool_sizes, requests_at_context
from kvcache.sizing.plan_request import PlanRequest
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.pool_layout import CacheLayout
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory

Outcome = Literal["fits", "target", "one_request", "weights", "invalid"]
# How close a cell that does not fit came: it planned but misses the target, holds no full request, or
# does not hold the weights; an invalid layout (a TP size the heads do not divide) comes last.
CLOSENESS: dict[Outcome, int] = {"fits": 4, "target": 3, "one_request": 2, "weights": 1, "invalid": 0}


class FitTarget(msgspec.Struct, frozen=True, kw_only=True):
    """What the operator wants served: `requests` at once of `context_length` tokens each, or `tokens` in all."""

    requests: int | None = None
    tokens: int | None = None
    context_length: int | None = None  # --context-length, which every cell plans with

    def describe(self, context: int) -> str:
        if self.requests is not None:
            return f"{self.requests:,} requests of {context:,} tokens"
        return f"{self.tokens:,} tokens"


class FitRow(msgspec.Struct, frozen=True, kw_only=True):
    """One cell of the sweep. Keys are stable: scripts read them from `fit --json`."""

    card: str
    card_bytes: int
    tp_size: int
    pp_size: int
    gpus: int  # tp_size x pp_size cards
    kv_cache_dtype: str  # as asked: auto, fp8_e4m3, ...
    kv_cache_dtype_resolved: str | None  # what auto means for this model (bfloat16, ...); None for an invalid cell
    fits: bool
    outcome: Outcome  # fits, or why not: target, one_request, weights, invalid
    why_not: str  # one line; "" when it fits
    needed_bytes: int | None  # a cell that does not plan: what it needed (the weights, one request) ...
    available_bytes: int | None  # ... and what it had
    weights_bytes: int | None  # per GPU
    budget_bytes: int | None  # the KV budget per GPU
    max_total_tokens: int | None  # what a bootstrap with these flags holds (`plan`'s headline: tokens_source says how)
    static_plan_tokens: int | None  # SGLang's static plan (its fraction's budget)
    tokens_source: str | None  # static_plan, prediction_<calibrated|uncalibrated|extrapolated>, vllm_answer (fit_vllm)
    max_running_requests: int | None  # the plan's running-request cap
    context_length: int  # the context every request of the target may reach
    requests_at_context: int | None  # requests of context_length tokens the plan holds at once
    headroom: float | None  # what the plan holds over what the target asks (1.0: exactly the target)
    cheapest: bool = False

    @property
    def closeness(self) -> tuple[int, float]:
        """How near the target: the outcome's rank, then the share of the target (or of what it needed) it had."""
        if self.headroom is not None:
            return CLOSENESS[self.outcome], self.headroom
        share = self.available_bytes / self.needed_bytes if self.needed_bytes and self.available_bytes else 0.0
        return CLOSENESS[self.outcome], share


@dataclass(frozen=True, slots=True)
class _Stage:
    """One pipeline stage's first TP rank as `plan` wires it: its sizing, its pools, each worker's weight bytes."""

    sizing: WorkerSizing
    layout: CacheLayout
    weights: tuple[int, ...]  # the target's, then a draft's


@dataclass(frozen=True, slots=True)
class _Combination:
    """A (TP, PP, KV dtype, context) point: every pipeline stage (one without --pp-size)."""

    stages: tuple[_Stage, ...]


@dataclass(slots=True)
class FitSweep:
    """Plans cells for one model and one set of ServerArgs values; combinations are built once and reused."""

    model: ModelConfig
    settings: dict[str, Any]  # ServerArgs fields from --config and the flags, without the swept ones
    target: FitTarget
    _combinations: dict[tuple[int, int, str, int | None], _Combination | ConfigError] = field(default_factory=dict)
    _weights: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict)

    def running_cap(self, rows: list[FitRow]) -> tuple[str, int | None]:  # the cap's field and the value given
        return "max_running_requests", self.settings.get("max_running_requests")

    def row_start(self, card: SimulatedCard, tp: int, pp: int, dtype: str, context: int | None) -> dict[str, Any]:
        """A cell's FitRow values known before it plans."""
        return dict(card=card.name, card_bytes=card.total_bytes, tp_size=tp, pp_size=pp, gpus=tp * pp,
                    kv_cache_dtype=dtype, context_length=context or self.model.context_length(None))

    def cell_server_args(self, tp: int, pp: int, dtype: str, context: int | None) -> ServerArgs:
        """A cell's ServerArgs (the request length under --engine's name); a bad value is bad input: exit 2."""
        values = {**self.settings, "device": "meta", "tp_size": tp, "pp_size": pp, "kv_cache_dtype": dtype}
        if context is not None:
            values["max_model_len" if self.settings.get("engine") == "vllm" else "context_length"] = context
        return ServerArgs.from_mapping(values)

    def combination(self, tp: int, pp: int, dtype: str, context: int | None) -> _Combination | ConfigError:
        """The worker wiring for these values, or why the model cannot be laid out so (cached: every card of a
        combination shares it; each cell makes its own card's probe)."""
        key = (tp, pp, dtype, context)
        if key not in self._combinations:
            server_args = self.cell_server_args(tp, pp, dtype, context)
            try:
                self._combinations[key] = _Combination(tuple(self._stage(server_args, s) for s in range(pp)))
            except ConfigError as exc:
                self._combinations[key] = exc
            else:  # a value the engine refuses at start-up (--context-length 1) is bad input for every cell too
                sizing = self._combinations[key].stages[0].sizing  # type: ignore[union-attr]
                refusal = sizing.engine.startup_refusal(self.model.context_length(
                    server_args.context_length, allow_long_context=server_args.allow_long_context), sizing.settings)
                if refusal is not None:
                    raise ConfigError(refusal)
        return self._combinations[key]

    def _stage(self, server_args: ServerArgs, stage: int) -> _Stage:
        """Stage `stage`'s wiring as `plan` wires it (app.plan_wiring), given that stage's ParallelState (stage 0's
        is the single-process layout's)."""
        state = replace(single_process_state(server_args), pp_rank=stage)
        key = (server_args.tp_size, server_args.pp_size, stage)
        workers = planned_workers(server_args, self.model, state)
        layout = workers.sizing.layout()  # refuses a TP size the heads do not divide, a dtype the head dims do not pack
        self._weights.setdefault(key, workers.weights)  # the KV dtype and the context change no weight
        return _Stage(sizing=workers.sizing, layout=layout, weights=self._weights[key])

    def cell(self, card: SimulatedCard, tp: int, pp: int, dtype: str, context: int | None = None) -> FitRow:
        """One cell: does the model plan on `card` with these values, and does the plan meet the target. With
        pipeline stages, as the ranks agree (KVCacheConfigurator._plan): every stage plans with the smallest
        free memory, then keeps the smallest stage's tokens."""
        context = self.target.context_length if context is None else context
        combination = self.combination(tp, pp, dtype, context)
        row = self.row_start(card, tp, pp, dtype, context)
        if isinstance(combination, ConfigError):
            return refused(row, "invalid", str(combination).splitlines()[0])
        stages = combination.stages
        row["kv_cache_dtype_resolved"] = stages[0].sizing.kv_cache_dtype.name
        row["weights_bytes"] = max(stage.weights[0] for stage in stages)
        memories = []
        for stage in stages:
            probe = FixedMemoryProbe.of_card(card)  # the card `plan --gpu` simulates
            free_before = probe.free_bytes()
            for weights in stage.weights:  # ModelRunner.load_weights' check and debit, worker by worker
                if weights > probe.free_bytes():
                    return refused(row, "weights", f"weights {gib(weights)} per GPU, {gib(probe.free_bytes())} free",
                                    needed_bytes=weights, available_bytes=probe.free_bytes())
                probe.note_allocation(weights)
            memories.append(WorkerMemory(total_bytes=probe.total_bytes(), free_before_load=free_before,
                                         free_after_load=probe.free_bytes(),
                                         reported_total_bytes=probe.device_capacity_bytes()))
        memory = WorkerMemory.smallest(memories)
        try:
            planned = [plan_without_advice(stage.sizing, stage.layout, memory) for stage in stages]
            tokens = min(plan.max_total_num_tokens for plan, _ in planned)
            planned = [(plan, request) if plan.max_total_num_tokens <= tokens else
                       _replanned(request, tokens) for plan, request in planned]
        except (WeightsLeaveNoRoomError, KVCacheMemoryTooLargeError) as exc:
            return refused(row, "weights", f"{exc.what} (needed {gib(exc.needed_bytes)}, "
                            f"available {gib(exc.available_bytes)})",
                            needed_bytes=exc.needed_bytes, available_bytes=exc.available_bytes)
        except DoesNotFitError as exc:
            return refused(row, "one_request", exc.what, budget_bytes=exc.available_bytes,
                            needed_bytes=exc.needed_bytes, available_bytes=exc.available_bytes)
        except ConfigError as exc:
            return refused(row, "invalid", str(exc).splitlines()[0])
        static_tokens, source = tokens, "static_plan"
        static = min((p for p, _ in planned), key=lambda p: p.budget.budget_bytes)  # the tightest stage's
        running = min(p.max_running_requests for p, _ in planned)
        predicted = predict_measured_plan(sizing=stages[0].sizing, memory=memory, card_name=card.name) \
            if len(stages) == 1 else None  # what a measured bootstrap holds: `plan`'s headline
        if predicted is not None:
            planned = [(predicted[1], planned[0][1])]  # the same pools and context, re-planned
            tokens, source = predicted[0].tokens, f"prediction_{predicted[0].basis}"
        held = min(requests_at_context(request, plan) for plan, request in planned)
        against = planned[0][0] if predicted is not None else static
        headroom, why = self.against_target(
            held=held, tokens=against.max_total_num_tokens, context=against.context_length,
            running_cap=against.max_running_requests, cap_flag="--max-running-requests",
            note="" if against.kv_pools else (f"; without per-token KV its {against.max_total_num_tokens:,} token slots "
                                              "hold the requests' tokens (--max-total-tokens)"))
        return FitRow(**row, fits=not why, outcome="target" if why else "fits", why_not=why,
                      needed_bytes=None, available_bytes=None, static_plan_tokens=static_tokens, tokens_source=source,
                      budget_bytes=static.budget.budget_bytes, max_total_tokens=tokens,  # the budget is `plan`'s
                      max_running_requests=running, requests_at_context=held, headroom=headroom)

    def against_target(self, *, held: int, tokens: int, context: int, running_cap: int, cap_flag: str,
                       note: str = "") -> tuple[float, str]:
        """(over the target, why short or "") for `held` requests of `context` at once, `tokens` in all."""
        t = self.target
        if t.requests is not None:
            headroom = held / t.requests
            if held >= t.requests:
                return headroom, ""
            cap = f"; the running-request cap is {running_cap:,} ({cap_flag})" if running_cap < t.requests else ""
            cap += note if tokens < t.requests * context else ""
            return headroom, (f"holds {held:,} request{'s' if held != 1 else ''} of {context:,} tokens, "
                              f"{t.requests:,} wanted{cap}")
        assert t.tokens is not None
        headroom = tokens / t.tokens
        if tokens >= t.tokens:
            return headroom, ""
        return headroom, f"holds {tokens:,} tokens, {t.tokens:,} wanted"


def plan_without_advice(sizing: WorkerSizing, layout: CacheLayout,
                        memory: WorkerMemory) -> tuple[MemoryPoolConfig, PlanRequest]:
    """WorkerSizing.plan's budget, request and planner for one rank with this memory, raising the same typed
    errors without the advice a refused plan searches for (a sweep asks only yes or no, and why)."""
    request = sizing.plan_request(layout, sizing.budget(memory))  # a cell serves requests of its full context:
    request = msgspec.structs.replace(request, below_one_request="refuse")  # an engine's shorter cap is a "no"
    return plan_pool_sizes(request), request


def _replanned(request: PlanRequest, at_most_tokens: int) -> tuple[MemoryPoolConfig, PlanRequest]:
    """A stage's plan capped at the tokens the stages agreed on (WorkerSizing.plan's at_most_tokens)."""
    if request.max_total_tokens is None or at_most_tokens < request.max_total_tokens:
        request = msgspec.structs.replace(request, max_total_tokens=at_most_tokens)
    return plan_pool_sizes(request), request


def refused(row: dict[str, Any], outcome: Outcome, why: str, **known: Any) -> FitRow:
    """A row that does not fit: the numbers it got as far as (`known`), the rest None."""
    unknown = dict.fromkeys(f for f in FitRow.__struct_fields__ if f not in ("fits", "outcome", "why_not", "cheapest"))
    return FitRow(**{**unknown, **row, **known}, fits=False, outcome=outcome, why_not=why)


def gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def ordered(rows: list[FitRow]) -> list[FitRow]:
    """Rows that fit first, by GPUs then the least headroom (the smallest setup that meets the target, the
    cheapest, first); then the rest by GPUs, the closest first. The first row that fits is marked cheapest."""
    fitting = sorted((r for r in rows if r.fits), key=lambda r: (r.gpus, r.headroom, r.card_bytes))
    rest = sorted((r for r in rows if not r.fits),
                  key=lambda r: (r.gpus, -r.closeness[0], -r.closeness[1], r.card_bytes))
    if fitting:
        fitting[0] = msgspec.structs.replace(fitting[0], cheapest=True)
    return fitting + rest


def closest(rows: list[FitRow]) -> FitRow | None:
    """Of rows that do not fit, the one that came closest (planned and nearest the target; then fewest GPUs)."""
    misses = [r for r in rows if not r.fits]
    return max(misses, key=lambda r: (r.closeness, -r.gpus), default=None)


def run_sweep(sweep: FitSweep, cards: list[SimulatedCard], tp_sizes: list[int], pp_sizes: list[int],
              dtypes: list[str], on_cell: Callable[[int, int], None] = lambda done, total: None) -> list[FitRow]:
    """Every cell, in order of the flags; `on_cell(done, total)` after each (the progress line)."""
    cells = [(card, tp, pp, dtype) for tp in tp_sizes for pp in pp_sizes for dtype in dtypes for card in cards]
    rows = []
    for i, (card, tp, pp, dtype) in enumerate(cells):
        rows.append(sweep.cell(card, tp, pp, dtype))
        on_cell(i + 1, len(cells))
    invalid = [r for r in rows if r.outcome == "invalid"]
    if len(invalid) == len(rows):  # no cell could be laid out: the input, not the sweep, is wrong
        first = sweep.combination(tp_sizes[0], pp_sizes[0], dtypes[0], sweep.target.context_length)
        raise first if isinstance(first, ConfigError) else ConfigError(invalid[0].why_not)
    return rows

