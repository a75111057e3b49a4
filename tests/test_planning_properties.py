"""Planner invariants over random budgets, pages, contexts, caps and model families.

For every request the planner either returns a plan or raises a DoesNotFitError subclass
(never anything else), and a plan
  - fits: total_bytes <= budget, and total_bytes is exactly plan_cost(T) (no buffer left out);
  - is page-aligned, and at least one request (or one window) long;
  - is maximal: one more page would not fit, unless --max-total-tokens stops it;
  - leaves less than one page of every pool (plus one request row and the allocator's rounding)
    unused whenever the running-request cap R does not move across that page.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvcache.engines.sglang_minimums import SGLANG_MINIMUMS
from kvcache.sizing.allocator_footprint import allocator_index_bytes
from kvcache.byte_units import GiB, KiB, MiB
from kvcache.configurator import KVCacheConfigurator
from kvcache.sizing.arena_sizes import LARGE_ROUND
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.errors import BudgetBelowOnePageError, BudgetBelowOneRequestError, ConfigError, DoesNotFitError
from kvcache.sizing.layer_specs import check_tensor_parallel
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.planning import plan_cost, plan_pool_sizes, requests_at_context, running_requests
from kvcache.arithmetic import align_down, align_up
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest, StateDemand
from kvcache.sizing.pool_config import REQ_TO_TOKEN_ELEMENT_BYTES, MemoryPoolConfig
from kvcache.models.presets import load_model_config
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.runtime.streams import HostStream
from kvcache.allocators.factory import allocator_for_plan
from kvcache.testing import FixedMemoryProbe

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PAGES = st.sampled_from([1, 2, 16, 32, 64, 128, 256])
SMALL_BUDGETS = st.integers(min_value=1 * KiB, max_value=64 * MiB)  # around one page and one request
MID_BUDGETS = st.integers(min_value=64 * MiB, max_value=8 * GiB)
LARGE_BUDGETS = st.integers(min_value=8 * GiB, max_value=400 * GiB)
BUDGETS = st.one_of(SMALL_BUDGETS, MID_BUDGETS, MID_BUDGETS, LARGE_BUDGETS, LARGE_BUDGETS)
PRESET_BUDGETS = st.one_of(st.integers(16 * MiB, 8 * GiB), LARGE_BUDGETS)
CONTEXTS = st.one_of(st.integers(1, 8192), st.integers(1, 262_144))

LEAST_CONTEXT = SGLANG_MINIMUMS.context_length  # a context of 1 is refused before planning


def memory_budget(budget_bytes: int) -> MemoryBudget:
    return MemoryBudget(budget_bytes=budget_bytes, total_bytes=budget_bytes, free_before_load_bytes=budget_bytes,
                        free_after_load_bytes=budget_bytes, mem_fraction_static=None, kv_cache_memory_bytes=budget_bytes)


# ---- hand-built model families ----------------------------------------------------------

@st.composite
def element_bytes(draw: st.DrawFn) -> int:
    return draw(st.sampled_from([1, 2, 4]))


@st.composite
def dense_gqa(draw: st.DrawFn) -> dict[str, Any]:
    layers, heads, dim = draw(st.integers(1, 128)), draw(st.sampled_from([1, 2, 4, 8, 32])), draw(st.sampled_from([64, 128, 256]))
    return {"kv_pools": (KVPoolDemand(name="full", kind="full", num_layers=layers,
                                      bytes_per_token=layers * heads * dim * 2 * draw(element_bytes())),)}


@st.composite
def mla(draw: st.DrawFn) -> dict[str, Any]:
    layers = draw(st.integers(1, 61))
    return {"kv_pools": (KVPoolDemand(name="mla", kind="mla", num_layers=layers,
                                      bytes_per_token=layers * (512 + 64) * draw(element_bytes())),)}


@st.composite
def swa_paired(draw: st.DrawFn) -> dict[str, Any]:
    per_layer = draw(st.sampled_from([1, 8])) * draw(st.sampled_from([64, 128, 256])) * 2 * draw(element_bytes())
    full_layers, swa_layers = draw(st.integers(1, 32)), draw(st.integers(1, 32))
    window = draw(st.sampled_from([128, 512, 1024, 4096]))
    return {
        "kv_pools": (
            KVPoolDemand(name="full", kind="full", num_layers=full_layers, bytes_per_token=full_layers * per_layer),
            KVPoolDemand(name="swa", kind="swa", num_layers=swa_layers, bytes_per_token=swa_layers * per_layer,
                         window=window, share="swa"),
        ),
        "swa_ratio": Fraction(draw(st.integers(1, 1000)), 1000),
    }


@st.composite
def all_sliding(draw: st.DrawFn) -> dict[str, Any]:
    layers = draw(st.integers(1, 48))
    return {"kv_pools": (KVPoolDemand(name="swa", kind="swa", num_layers=layers, bytes_per_token=layers * 8 * 256 * 2,
                                      window=draw(st.sampled_from([128, 4096])), share="all"),)}


@st.composite
def recurrent_and_full(draw: st.DrawFn) -> dict[str, Any]:
    full_layers, state_layers = draw(st.integers(1, 16)), draw(st.integers(1, 64))
    state = StateDemand(
        num_layers=state_layers,
        bytes_per_slot=state_layers * draw(st.integers(16 * KiB, 20 * MiB)),
        slots_per_request=draw(st.sampled_from([1, 3])),
        memory_ratio=Fraction(draw(st.integers(1, 40)), 10),
        max_slots=draw(st.none() | st.integers(1, 2000)),
    )
    return {"kv_pools": (KVPoolDemand(name="full", kind="full", num_layers=full_layers,
                                      bytes_per_token=full_layers * 2 * 256 * 2 * 2),),
            "state": state}


FAMILIES = st.one_of(dense_gqa(), mla(), swa_paired(), all_sliding(), recurrent_and_full())


@st.composite
def hand_built_requests(draw: st.DrawFn) -> PlanRequest:
    family = draw(FAMILIES)
    context = draw(CONTEXTS)
    return PlanRequest(
        budget=memory_budget(draw(BUDGETS)),
        page_size=draw(PAGES),
        context_length=context,
        req_to_token_row_width=context + draw(st.sampled_from([0, 2, 4, 8])),
        max_total_tokens=draw(st.none() | st.integers(1, 20_000_000)),
        max_running_requests=draw(st.none() | st.integers(1, 10_000)),
        attention_dp_size=draw(st.sampled_from([1, 1, 2, 8])),
        below_one_request=draw(st.sampled_from(["refuse", "cap"])),
        **family,
    )


# ---- the same through the configurator on real presets --------------------------------

PRESETS = ["Llama-3.1-8B-Instruct", "Llama-2-7b-hf", "Qwen3-8B", "SmolLM2-135M", "DeepSeek-V3", "DeepSeek-V2-Lite",
           "gpt-oss-20b", "gemma-2-9b-it", "Mistral-7B-v0.1", "Qwen3-Next-80B-A3B-Thinking", "Nemotron-H-56B-Base-8K"]


@lru_cache(maxsize=None)
def preset(name: str) -> ModelConfig:
    return load_model_config(name)


@st.composite
def preset_requests(draw: st.DrawFn) -> PlanRequest:
    name = draw(st.sampled_from(PRESETS))
    model = preset(name)
    page = draw(PAGES)
    args: dict[str, Any] = {
        "device": "meta",
        "page_size": page,
        "context_length": draw(st.integers(LEAST_CONTEXT, min(8192, model.max_position_embeddings))  # SGLang's
                               | st.integers(LEAST_CONTEXT, model.max_position_embeddings)),  # start-up minimum
        "kv_cache_dtype": draw(st.sampled_from(["auto", "fp8_e4m3", "float32"])),
        "tp_size": draw(st.sampled_from([t for t in (1, 2, 8) if fits_tp(model, t)])),
        "swa_full_tokens_ratio": draw(st.sampled_from([0.01, 0.1, 0.5, 0.8, 1.0])),
        "mamba_full_memory_ratio": draw(st.sampled_from([0.1, 0.9, 3.0])),
        "disable_radix_cache": draw(st.booleans()),
    }
    if draw(st.booleans()):
        args["max_total_tokens"] = draw(st.integers(page, 10_000_000))
    if draw(st.booleans()):
        args["max_running_requests"] = draw(st.integers(1, 5000))
    if draw(st.integers(0, 3)) == 0:
        args["max_mamba_cache_size"] = draw(st.integers(1, 500))
    server_args = ServerArgs.from_mapping(args)
    model_dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    parallel = ParallelState(tp_size=server_args.tp_size)
    c = KVCacheConfigurator(
        settings=SizingSettings.from_server_args(server_args), model_config=model, parallel_state=parallel, model_dtype=model_dtype,
        kv_cache_dtype=resolve_kv_cache_dtype(server_args.kv_cache_dtype, model_dtype), device=torch.device("meta"),
        memory_probe=FixedMemoryProbe(total_bytes=1 << 50), allocator_factory=allocator_for_plan,
        forward_stream=HostStream(torch.device("meta")), layer_ids=parallel.layer_range(model.num_hidden_layers),
    )
    return c.sizing.plan_request(c.sizing.layout(), memory_budget(draw(PRESET_BUDGETS)))


def fits_tp(model: ModelConfig, tp: int) -> bool:
    """Whether attention TP `tp` splits the model's heads (SmolLM2's 9 heads take 1 or 3, not 2 or 8)."""
    try:
        check_tensor_parallel(model, tp)
    except ConfigError:
        return False
    return True


# ---- the invariants ---------------------------------------------------------------------

def one_request_tokens(req: PlanRequest) -> int:
    if all(p.window is not None for p in req.kv_pools):
        return align_up(min(req.context_length, min(p.window for p in req.kv_pools) + req.page_size), req.page_size)  # type: ignore[type-var]
    return align_up(req.context_length, req.page_size)


def check_plan(req: PlanRequest, plan: MemoryPoolConfig) -> None:
    budget, page = req.budget.budget_bytes, req.page_size
    t = plan.max_total_num_tokens
    slots = plan.state_pool.num_slots if plan.state_pool else 0

    # fits, and the plan's buffers are the cost the planner charged
    assert plan.total_bytes == plan_cost(req, t, slots) <= budget
    # page-aligned, at least one request
    assert t > 0 and t % page == 0
    if req.below_one_request == "refuse":
        assert t >= one_request_tokens(req)
    elif t < one_request_tokens(req):  # SGLang 0.5.23 runs a shorter pool, each request capped at the pool less one
        assert t >= 2 and plan.request_token_cap == t - 1
    if req.max_total_tokens is not None:
        assert t <= req.max_total_tokens

    # pools: 'all' pools hold every token, paired window pools their share and at least one window + page
    for demand, pool in zip(req.kv_pools, plan.kv_pools):
        if demand.share == "all":
            assert pool.num_tokens == t and pool.holds_every_token
        else:
            assert pool.num_tokens == align_down(t * req.swa_ratio.numerator // req.swa_ratio.denominator, page)
            assert pool.num_tokens > (demand.window or 0) + page  # SGLang 0.5.23 admits a request only then
        assert pool.num_tokens % page == 0

    # running requests
    r = plan.max_running_requests
    assert r == running_requests(req, t, slots) >= 1
    if req.max_running_requests is not None:
        assert r <= max(1, req.max_running_requests // req.attention_dp_size)
    assert r <= max(1, t // 2)
    if plan.state_pool is not None:
        assert r * plan.state_pool.slots_per_request <= plan.state_pool.usable_slots
    # a strict plan holds one request of the context at once: requests_at_context counts a request in a paired
    # window pool as the pool's floor does (window_request_tokens), so a pool past that floor holds one
    if req.below_one_request == "refuse":
        assert requests_at_context(req, plan) >= 1

    # maximal: one more page does not fit, unless the token cap stops it
    capped = req.max_total_tokens is not None and t + page > req.max_total_tokens
    if not capped:
        assert plan_cost(req, t + page, slots) > budget
        # with R the same across that page, what is left is less than a page of every pool
        # (each rounded to at most one more 2 MiB block), the allocator's extra index bytes, and a row
        if running_requests(req, t + page, slots) == r:
            swa = [p for p in plan.kv_pools if not p.holds_every_token]
            swa_now = swa[0].num_tokens if swa else None
            swa_next = align_down((t + page) * req.swa_ratio.numerator // req.swa_ratio.denominator, page) if swa else None
            index_step = allocator_index_bytes(t + page, page, swa_next) - allocator_index_bytes(t, page, swa_now)
            row = (plan.req_to_token_row_width + (1 if plan.state_pool else 0)) * REQ_TO_TOKEN_ELEMENT_BYTES
            one_page = sum(page * p.bytes_per_token + LARGE_ROUND for p in plan.kv_pools)
            assert budget - plan.total_bytes < one_page + index_step + row


def state_slots(req: PlanRequest) -> int:
    """Slots, padding included: the user's count + 1, or the budget's share r / (1 + r) in whole slots."""
    s = req.state
    if s is None:
        return 0
    if s.max_slots is not None:
        return s.max_slots + 1
    r = s.memory_ratio
    return req.budget.budget_bytes * r.numerator // (r.numerator + r.denominator) // s.bytes_per_slot


def check_refusal(req: PlanRequest, err: DoesNotFitError) -> None:
    """A refusal is honest: the smallest plan that would be allowed really does not fit."""
    budget, page = req.budget.budget_bytes, req.page_size
    slots = state_slots(req)
    assert err.available_bytes == budget
    assert err.needed_bytes > 0
    if isinstance(err, BudgetBelowOnePageError):
        cap_below_page = req.max_total_tokens is not None and req.max_total_tokens < page
        assert cap_below_page or plan_cost(req, page, slots) > budget
    elif isinstance(err, BudgetBelowOneRequestError) and str(err).startswith("the KV budget holds"):
        need = one_request_tokens(req) if req.below_one_request == "refuse" else 2
        capped = req.max_total_tokens is not None and req.max_total_tokens < need
        assert capped or plan_cost(req, need, slots) > budget
    elif isinstance(err, BudgetBelowOneRequestError) and str(err).startswith("the state share"):
        assert req.state is not None and slots - 1 < req.state.slots_per_request
    elif type(err) is DoesNotFitError:
        assert req.state is not None and slots * req.state.bytes_per_slot > budget


def plan_or_refuse(req: PlanRequest) -> None:
    try:
        plan = plan_pool_sizes(req)
    except DoesNotFitError as err:  # anything else fails the test
        event(f"refused: {type(err).__name__}")
        check_refusal(req, err)
        return
    event("planned")
    check_plan(req, plan)


@SETTINGS
@given(hand_built_requests())
def test_hand_built_requests_plan_or_refuse(req: PlanRequest) -> None:
    plan_or_refuse(req)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset_requests())
def test_preset_requests_plan_or_refuse(req: PlanRequest) -> None:
    plan_or_refuse(req)


@SETTINGS
@given(hand_built_requests(), st.integers(0, 2**22), st.integers(1, 2**22))
def test_cost_is_monotone_in_tokens(req: PlanRequest, pages: int, more: int) -> None:
    # the bisection is only right if one more page never costs less
    slots = 0 if req.state is None else 1 + req.state.slots_per_request
    page = req.page_size
    assert plan_cost(req, pages * page, slots) <= plan_cost(req, (pages + more) * page, slots)


@settings(max_examples=60, deadline=None)
@given(dense_gqa(), PAGES, st.integers(16 * MiB, 100 * GiB), st.integers(1, 4096))
def test_with_a_fixed_request_cap_the_slack_is_under_a_page(family: dict[str, Any], page: int, budget: int,
                                                            cap: int) -> None:
    # a user-given max_running_requests well under T // 2 fixes R: the request table is constant,
    # so what is left is less than one page of KV (plus allocator rounding)
    req = PlanRequest(budget=memory_budget(budget), page_size=page, context_length=page, req_to_token_row_width=page,
                      max_running_requests=cap, **family)
    try:
        plan = plan_pool_sizes(req)
    except DoesNotFitError:
        return
    assume(plan.max_total_num_tokens // 2 >= cap)
    assert plan.max_running_requests == cap
    (pool,) = plan.kv_pools
    slack = budget - plan.total_bytes
    assert 0 <= slack < page * pool.bytes_per_token + LARGE_ROUND + 8  # + one index entry


@pytest.mark.parametrize("budget", [1, 511, 4096])
def test_tiny_budgets_are_refused_not_crashed(budget: int) -> None:
    req = PlanRequest(budget=memory_budget(budget), page_size=16, context_length=16, req_to_token_row_width=16,
                      kv_pools=(KVPoolDemand(name="full", kind="full", num_layers=1, bytes_per_token=4096),))
    with pytest.raises(BudgetBelowOnePageError):
        plan_pool_sizes(req)
