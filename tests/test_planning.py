"""plan_pool_sizes: tokens, requests and every buffer's bytes, by hand and through the configurator.

Each buffer is a slot of its worker's one arena, S(n) = kvcache.sizing.arena_sizes.slot_size: n
rounded up to 512 B; the arena is the slots' sum rounded up to 2 MiB (at least 10 MiB). The
allocator's index is a free log of two int64 per page (per token at page_size 1), plus, with a
paired sliding-window pool, its free log and one int64 per full-pool row.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import Any

import msgspec
import pytest
import torch

from kvcache.byte_units import GiB, MiB, parse_bytes
from kvcache.configurator import KVCacheConfigResult, KVCacheConfigurator
from kvcache.engines.sglang import SGLangRules
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.errors import (
    BudgetBelowOnePageError, BudgetBelowOneRequestError, DoesNotFitError, KVCacheMemoryTooLargeError,
    WeightsLeaveNoRoomError,
)
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.planning import plan_cost, plan_pool_sizes, running_requests, window_request_tokens
from kvcache.arithmetic import align_down
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest, StateDemand
from kvcache.sizing.pool_config import DRAFT_POOL_PREFIX, MemoryPoolConfig
from kvcache.sizing.arena_sizes import arena_size, slot_size
from kvcache.sizing.pool_layout import worker_cache_layout
from kvcache.models.presets import load_model_config
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.runtime.streams import HostStream
from kvcache.allocators.factory import allocator_for_plan
from kvcache.testing import FixedMemoryProbe

META = torch.device("meta")
QWEN3_NEXT = "Qwen3-Next-80B-A3B-Thinking"


def memory_budget(budget_bytes: int) -> MemoryBudget:
    return MemoryBudget(budget_bytes=budget_bytes, total_bytes=max(budget_bytes, 1), free_before_load_bytes=budget_bytes,
                        free_after_load_bytes=budget_bytes, mem_fraction_static=None, kv_cache_memory_bytes=budget_bytes)


def full(bytes_per_token: int, name: str = "full", layers: int = 1) -> KVPoolDemand:
    return KVPoolDemand(name=name, kind="full", num_layers=layers, bytes_per_token=bytes_per_token)


def request(budget_bytes: int, pools: tuple[KVPoolDemand, ...], *, page: int = 1, context: int = 256,
            **kwargs: Any) -> PlanRequest:
    return PlanRequest(budget=memory_budget(budget_bytes), page_size=page, context_length=context,
                       req_to_token_row_width=kwargs.pop("row_width", context), kv_pools=pools, **kwargs)


class FullRequestRules(SGLangRules):
    """SGLang 0.5.23's rules with a pool shorter than one full-context request refused (SGLang runs it, capping each
    request: tests/test_request_cap.py): the question every suggestion here is checked against."""

    below_one_request = "refuse"


def configurator(model: str, *, total: int = 80 * GiB, free_after: int | None = None, **args: Any) -> KVCacheConfigurator:
    """Built the way the containers build it: dtypes resolved once, this rank's layers, a simulated card; a pool
    shorter than one full-context request is refused (FullRequestRules)."""
    server_args = ServerArgs.from_mapping({"device": "meta", **args})
    model_config = load_model_config(model)
    model_dtype = resolve_model_dtype(server_args.dtype, model_config.checkpoint_dtype)
    parallel = ParallelState(tp_size=server_args.tp_size, pp_size=server_args.pp_size,
                             attention_dp_size=server_args.attention_dp_size)
    return KVCacheConfigurator(
        settings=SizingSettings.from_server_args(server_args), model_config=model_config, parallel_state=parallel, model_dtype=model_dtype,
        kv_cache_dtype=resolve_kv_cache_dtype(server_args.kv_cache_dtype, model_dtype), device=META,
        memory_probe=FixedMemoryProbe(total_bytes=total, free_bytes=free_after),
        allocator_factory=allocator_for_plan, forward_stream=HostStream(META),
        layer_ids=parallel.layer_range(model_config.num_hidden_layers), engine=FullRequestRules(),
    )


def plan_for(model: str, budget_bytes: int, **args: Any) -> tuple[PlanRequest, MemoryPoolConfig]:
    c = configurator(model, **args)
    req = c.sizing.plan_request(c.sizing.layout(), memory_budget(budget_bytes))
    return req, plan_pool_sizes(req)


def configure(model: str, *, total: int, free_before: int, free_after: int, **args: Any) -> KVCacheConfigResult:
    return configurator(model, total=total, free_after=free_after, **args).configure(pre_model_load_memory=free_before)


def slots_of(plan: MemoryPoolConfig) -> int:
    return plan.state_pool.num_slots if plan.state_pool else 0


# ---- by hand ----------------------------------------------------------------------------

def test_a_tiny_plan_by_hand() -> None:
    # one pool of 256 B/token, page 1, 7 requests of a 256-token row, a 10 MiB budget (the smallest arena):
    #   every buffer is a 512-byte aligned slot of the worker's one arena, whose size is the slots' sum
    #   rounded up to 2 MiB (at least 10 MiB)
    #   request table: (7 + 1) x 256 x 4 = 8,192 B; pool: S((T + 1) x 256); allocator index (two free
    #   logs of 2 T int64 each): 2 x S(16 T)
    #   T = 36,379: pool 36,380 x 256 = 9,313,280, index 2 x S(582,064) = 2 x 582,144 = 1,164,288:
    #   8,192 + 9,313,280 + 1,164,288 = 10,485,760 B, the whole arena
    #   T = 36,380: pool S(9,313,536) = 9,313,792, index 1,164,288: 10,486,272 B -> a 12 MiB arena > budget
    req = request(10 * MiB, (full(256),), max_running_requests=7)
    plan = plan_pool_sizes(req)
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (36_379, 7)
    assert plan.buffers == {"req_to_token": 8_192, "allocator_index": 1_164_288, "kv_full": 9_313_280}  # no padding
    assert plan.total_bytes == plan.arena_bytes() == 10 * MiB
    assert plan_cost(req, 36_380, 0) == 12 * MiB


def test_llama_8b_with_10_gib_by_hand() -> None:
    # Llama-3.1-8B bf16: 131,072 B/token; --context-length 32768; a 10 GiB budget (10,737,418,240 B)
    #   R = clamp(T x 512 // 32,768, 2,048, 4,096) = 2,048 (T is about 80k, so T x 512 // 32k is about 1,250)
    #   request table: 2,049 rows x (32,768 + 4) x 4 = 268,599,312 B (SGLang's rows hold 4 slots past the
    #   context) -> S() = 268,599,808
    #   left: 10,468,818,432 B for the pool (T + 1) x 131,072 plus the index 2 x S(16 T):
    #   T = 79,850: 10,466,230,272 + 2 x S(1,277,600) = 2 x 1,277,952 -> 32,256 B to spare, less than a token
    req, plan = plan_for("Llama-3.1-8B-Instruct", 10 * GiB, context_length=32768)
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (79_850, 2_048)
    assert plan.worker_buffers() == {"req_to_token": 268_599_808, "allocator_index": 2_555_904, "kv_full": 79_851 * 131_072}
    assert plan.buffers == {**plan.worker_buffers(), "arena_padding": 32_256}
    assert plan.total_bytes == 10 * GiB
    assert plan.bytes_per_token == 131_072


def test_qwen3_next_state_slots_with_a_radix_cache() -> None:
    # 44 GiB = 47,244,640,256 B; the state's share at --mamba-full-memory-ratio 0.9 is 9/19 of it:
    # 22,379,040,121 B, which holds 289 slots of 77,266,944 B (289.6); slot 0 is padding: 288 usable.
    # With the radix cache each request takes 5 slots (SGLang 0.5.23: 3, plus 2 tracking slots with the
    # overlap scheduler): 288 // 5 = 57 running requests.
    _, plan = plan_for(QWEN3_NEXT, 44 * GiB)
    assert plan.state_pool is not None
    assert (plan.state_pool.num_slots, plan.state_pool.usable_slots, plan.state_pool.bytes_per_slot) == (289, 288, 77_266_944)
    assert plan.state_pool.slots_per_request == 5
    assert plan.max_running_requests == plan.state_pool.request_cap == 57
    assert plan.buffers["state"] == slot_size(289 * 77_266_944)
    assert plan.pool("full").bytes_per_token == 24_576
    # the request table holds one more int32 column: each row's state slot (beside SGLang's 4 past the context)
    assert plan.req_to_token_bytes == slot_size(58 * (262_144 + 4 + 1) * 4) == 60_818_944


def test_qwen3_next_state_slots_without_a_radix_cache() -> None:
    _, plan = plan_for(QWEN3_NEXT, 44 * GiB, disable_radix_cache=True)
    assert plan.state_pool is not None
    assert (plan.state_pool.num_slots, plan.state_pool.slots_per_request) == (289, 1)
    assert plan.max_running_requests == 288  # one slot per request


def test_max_mamba_cache_size_sets_the_slots() -> None:
    # 40 usable slots + 1 padding; 40 // 5 = 8 requests with the radix cache
    _, plan = plan_for(QWEN3_NEXT, 44 * GiB, max_mamba_cache_size=40)
    assert plan.state_pool is not None and plan.state_pool.num_slots == 41
    assert plan.max_running_requests == 8


# ---- running requests -------------------------------------------------------------------

@pytest.mark.parametrize(
    ("tokens", "context", "user", "dp", "expected"),
    [
        (100_000, 131_072, None, 1, 2_048),  # 100,000 x 512 // 131,072 = 390 -> at least 2,048
        (1_000_000, 131_072, None, 1, 3_906),  # 1,000,000 x 512 // 131,072 = 3,906, inside the clamp
        (10_000_000, 1_000, None, 1, 4_096),  # 5,120,000 -> at most 4,096
        (3_000, 100, None, 1, 1_500),  # clamp gives 4,096, then <= T // 2 = 1,500
        (1_000_000, 131_072, None, 4, 3_906),  # the default is per attention-DP worker: not divided (SGLang 0.5.23)
        (1_000_000, 131_072, 100, 1, 100),  # the user's value
        (1_000_000, 131_072, 10_000, 1, 10_000),  # a user value is not clamped to 4,096 ...
        (1_000, 131_072, 10_000, 1, 500),  # ... but is capped at T // 2
        (1_000_000, 131_072, 10_000, 8, 1_250),  # ... and divided over attention DP
        (1, 131_072, None, 1, 1),  # never below one request
        (4, 131_072, 2, 4, 1),
    ],
)
def test_running_requests_rule(tokens: int, context: int, user: int | None, dp: int, expected: int) -> None:
    req = request(1 << 40, (full(2),), context=context, max_running_requests=user, attention_dp_size=dp)
    assert running_requests(req, tokens, 0) == expected


@pytest.mark.parametrize(("slots", "per_request", "expected"), [(289, 3, 96), (289, 1, 288), (4, 3, 1), (2, 1, 1)])
def test_running_requests_are_capped_by_state_slots(slots: int, per_request: int, expected: int) -> None:
    state = StateDemand(num_layers=1, bytes_per_slot=1, slots_per_request=per_request, memory_ratio=Fraction(9, 10))
    req = request(1 << 40, (full(2),), context=1024, state=state)
    assert running_requests(req, 10_000_000, slots) == expected


def test_dp_attention_keeps_the_default_requests_per_worker() -> None:
    # TP8, DP8 attention: every rank keeps all 8 KV heads (131,072 B/token), and R is per DP group
    req, plan = plan_for("Llama-3.1-8B-Instruct", 100 * GiB, tp_size=8, dp_size=8, enable_dp_attention=True,
                         context_length=8192)
    assert req.attention_dp_size == 8 and plan.bytes_per_token == 131_072
    # T is about 800k: 800k x 512 // 8,192 clamps to 4,096, each DP worker's own cap (SGLang 0.5.23's
    # resolve_max_num_reqs divides only a --max-running-requests over the DP workers; this divided 4,096 by 8)
    assert plan.max_running_requests == 4096


# ---- tokens: pages and caps ---------------------------------------------------------------

@pytest.mark.parametrize(
    ("page", "cap", "expected"),
    [(1, 1_000, 1_000), (16, 1_000, 992), (64, 1_000, 960), (64, 64, 64), (256, 100_000, 99_840)],
)
def test_tokens_are_page_aligned_and_capped(page: int, cap: int, expected: int) -> None:
    plan = plan_pool_sizes(request(1 << 34, (full(256),), page=page, context=64, max_total_tokens=cap))
    assert plan.max_total_num_tokens == expected  # align_down(cap, page): the budget holds far more
    assert plan.pool("full").num_rows == expected + page  # plus the padding page


@pytest.mark.parametrize("page", [1, 16, 64, 128])
def test_tokens_fill_the_budget_to_a_page(page: int) -> None:
    req = request(3 * GiB + 12_345, (full(40_960, layers=10),), page=page, context=4096, max_running_requests=16)
    plan = plan_pool_sizes(req)
    t = plan.max_total_num_tokens
    assert t % page == 0
    assert plan.total_bytes == plan_cost(req, t, 0) <= req.budget.budget_bytes
    assert plan_cost(req, t + page, 0) > req.budget.budget_bytes


# ---- every buffer is in the plan --------------------------------------------------------

@pytest.mark.parametrize(
    ("model", "args", "buffers"),
    [
        ("Llama-3.1-8B-Instruct", {"context_length": 8192}, {"req_to_token", "allocator_index", "kv_full"}),
        ("DeepSeek-V3", {"context_length": 8192}, {"req_to_token", "allocator_index", "kv_mla"}),
        ("gpt-oss-20b", {"page_size": 16}, {"req_to_token", "allocator_index", "kv_full", "kv_swa"}),
        ("Mistral-7B-v0.1", {}, {"req_to_token", "allocator_index", "kv_full"}),  # SGLang 0.5.23: one full pool
        ("Mistral-7B-v0.1", {"enable_hybrid_swa_memory": True}, {"req_to_token", "allocator_index", "kv_swa"}),
        (QWEN3_NEXT, {"context_length": 8192}, {"req_to_token", "allocator_index", "state", "kv_full"}),
        ("Nemotron-H-56B-Base-8K", {}, {"req_to_token", "allocator_index", "state", "kv_full"}),
    ],
)
def test_every_buffer_is_in_the_plan(model: str, args: dict[str, Any], buffers: set[str]) -> None:
    req, plan = plan_for(model, 40 * GiB, **args)
    assert set(plan.worker_buffers()) == buffers
    assert plan.total_bytes == arena_size(sum(plan.worker_buffers().values())) == sum(plan.buffers.values())
    assert plan.total_bytes == plan_cost(req, plan.max_total_num_tokens, slots_of(plan))
    assert plan.total_bytes % (2 * MiB) == 0
    assert plan.total_bytes <= 40 * GiB
    r, width = plan.max_running_requests, plan.req_to_token_row_width + (1 if plan.state_pool else 0)
    assert plan.buffers["req_to_token"] == slot_size((r + 1) * width * 4)
    for pool in plan.kv_pools:
        assert plan.buffers[f"kv_{pool.name}"] == slot_size((pool.num_tokens + plan.page_size) * pool.bytes_per_token)


@pytest.mark.parametrize("model", ["Llama-3.1-8B-Instruct", "gpt-oss-20b", QWEN3_NEXT, "DeepSeek-V3"])
def test_the_plan_is_json_encodable(model: str) -> None:
    _, plan = plan_for(model, 40 * GiB, context_length=4096)
    data = msgspec.json.decode(msgspec.json.encode(plan.to_dict()))
    assert data["max_total_num_tokens"] == plan.max_total_num_tokens
    assert data["total_bytes"] == plan.total_bytes and data["buffers"] == plan.buffers
    assert data["budget"]["budget_bytes"] == 40 * GiB
    assert [p["num_rows"] for p in data["kv_pools"]] == [p.num_rows for p in plan.kv_pools]
    if plan.state_pool is not None:
        assert data["state_pool"]["request_cap"] == plan.state_pool.request_cap
    assert msgspec.convert(msgspec.to_builtins(plan), MemoryPoolConfig) == plan  # the struct round-trips


def test_speculative_rows_leave_room_for_draft_tokens() -> None:
    # NEXTN: each request row holds context + SGLang's 4 + num_draft_tokens (3 steps + 1) token indices
    req, plan = plan_for("DeepSeek-V3", 40 * GiB, context_length=4096, speculative_algorithm="NEXTN")
    assert req.req_to_token_row_width == plan.req_to_token_row_width == 4096 + 4 + 4


# ---- sliding windows --------------------------------------------------------------------

@pytest.mark.parametrize(("page", "ratio"), [(1, 0.8), (16, 0.8), (64, 0.5), (16, 0.333), (1, 1.0)])
def test_a_paired_sliding_pool_gets_its_share(page: int, ratio: float) -> None:
    _, plan = plan_for("gpt-oss-20b", 10 * GiB, page_size=page, swa_full_tokens_ratio=ratio)
    t = plan.max_total_num_tokens
    full_pool, swa_pool = plan.pool("full"), plan.pool("swa")
    assert full_pool.num_tokens == t and full_pool.holds_every_token and not swa_pool.holds_every_token
    r = Fraction(repr(ratio))
    assert swa_pool.num_tokens == align_down(t * r.numerator // r.denominator, page)
    assert plan.bytes_per_token == 24_576  # only the full pool counts per token


def test_the_all_sliding_mistral_pool_holds_every_token() -> None:
    # one pool, 32 sliding layers: 131,072 B/token. 1 GiB holds about 6k tokens, fewer than the
    # 32,768 context, but one request only needs its 4,096-token window plus a page.
    _, plan = plan_for("Mistral-7B-v0.1", 1 * GiB, enable_hybrid_swa_memory=True)  # a window pool, as asked
    (pool,) = plan.kv_pools
    assert pool.name == "swa" and pool.holds_every_token and pool.num_tokens == plan.max_total_num_tokens
    assert 4_097 <= plan.max_total_num_tokens < 32_768


# ---- errors from the planner ------------------------------------------------------------

@pytest.mark.parametrize(("budget_bytes", "page"), [(1_000, 1), (2 * MiB, 16), (100 * MiB, 1024)])
def test_a_budget_below_one_page(budget_bytes: int, page: int) -> None:
    c = configurator("Llama-3.1-8B-Instruct", page_size=page, context_length=1024)
    req = c.sizing.plan_request(c.sizing.layout(), memory_budget(budget_bytes))
    with pytest.raises(BudgetBelowOnePageError, match=f"does not hold one page \\({page} tokens\\)") as info:
        plan_pool_sizes(req)
    assert info.value.available_bytes == budget_bytes < info.value.needed_bytes
    assert info.value.suggestions == ()


def test_a_budget_below_one_request() -> None:
    # 2 GiB hold about 16k tokens of Llama-3.1-8B (131,072 B each); one 131,072-token request does not fit
    c = configurator("Llama-3.1-8B-Instruct")
    req = c.sizing.plan_request(c.sizing.layout(), memory_budget(2 * GiB))
    with pytest.raises(BudgetBelowOneRequestError,
                       match=r"the KV budget holds [\d,]+ tokens, fewer than one request of --context-length 131072 "
                             r"needs \(131,072 tokens\)") as info:
        plan_pool_sizes(req)
    assert info.value.available_bytes == 2 * GiB
    assert info.value.needed_bytes == plan_cost(req, 131_072, 0) > 2 * GiB


def test_a_sliding_pool_below_one_window() -> None:
    # gpt-oss with ratio 0.01: ~1,900 full tokens in 48 MiB, the window pool gets 16, not more than 128 + 16
    c = configurator("gpt-oss-20b", page_size=16, context_length=512, max_running_requests=4,
                     swa_full_tokens_ratio=0.01)
    req = c.sizing.plan_request(c.sizing.layout(), memory_budget(48 * MiB))
    with pytest.raises(BudgetBelowOneRequestError,
                       match=r"the sliding-window pool 'swa' holds \d+ tokens, not more than one window \(128\) plus a page \(16\)"):
        plan_pool_sizes(req)


def test_a_state_share_below_one_request() -> None:
    # 200 MiB x 9/19 = 99 MB: one slot of 77,266,944 B, which is only the padding slot
    c = configurator(QWEN3_NEXT, context_length=4096)
    with pytest.raises(BudgetBelowOneRequestError, match="the state share of the budget holds 0 usable state slots; "
                                                         "one request needs 5"):
        plan_pool_sizes(c.sizing.plan_request(c.sizing.layout(), memory_budget(200 * MiB)))


def test_more_state_slots_than_the_budget() -> None:
    c = configurator(QWEN3_NEXT, max_mamba_cache_size=1000)
    with pytest.raises(DoesNotFitError, match=r"1000 state slots \(--max-mamba-cache-size, or --max-running-requests with "
                                              r"--disable-radix-cache\) take 72\.03 GiB .*more than the "
                                              r"whole KV budget"):
        plan_pool_sizes(c.sizing.plan_request(c.sizing.layout(), memory_budget(10 * GiB)))


# ---- the configurator's errors and what it suggests ---------------------------------------

SUGGESTION = re.compile(
    r"--(mem-fraction-static|kv-cache-memory|kv-cache-dtype|context-length|swa-full-tokens-ratio|max-mamba-cache-size) (\S+)"
)


def applied(args: dict[str, Any], suggestion: str) -> dict[str, Any]:
    """The server args with one suggestion taken (every flag it names, e.g. '--a 1 with --b 2')."""
    out = dict(args)
    for match in SUGGESTION.finditer(suggestion):
        out = _apply_one(out, *match.groups())
    return out


def _apply_one(args: dict[str, Any], flag: str, value: str) -> dict[str, Any]:
    key = flag.replace("-", "_")
    out = dict(args)
    if key == "mem_fraction_static":
        out.pop("kv_cache_memory", None)
        out[key] = float(value)
    elif key == "swa_full_tokens_ratio":
        out[key] = float(value)
    elif key == "kv_cache_dtype":
        out[key] = value
    elif key == "kv_cache_memory":
        out[key] = parse_bytes(value)  # a size as typed: "6530MiB"
    else:
        out[key] = int(value)
    return out


CARD_24 = dict(total=24_576 * MiB, free_before=24 * GiB, free_after=11 * GiB)  # 13 GiB of weights loaded

SCENARIOS = {
    # derived fraction 0.704 on 24 GiB (SGLang 0.5.23) keeps 7.10 GiB free: 3.90 GiB budget, ~31.9k tokens < 49,152
    "fraction": ("Llama-3.1-8B-Instruct", CARD_24, {"context_length": 49152}, BudgetBelowOneRequestError,
                 {"mem-fraction-static", "kv-cache-dtype", "context-length"}),
    "kv-cache-memory": ("Llama-3.1-8B-Instruct", CARD_24, {"context_length": 49152, "kv_cache_memory": 4 * GiB},
                        BudgetBelowOneRequestError, {"kv-cache-memory", "kv-cache-dtype", "context-length"}),
    # 68 GiB of weights on 80 GiB: 0.836 keeps 13.12 GiB free of the 12 GiB left
    "weights": ("SmolLM2-135M", dict(total=80 * GiB, free_before=80 * GiB, free_after=12 * GiB), {},
                WeightsLeaveNoRoomError, {"mem-fraction-static"}),
    # 64 MiB: ~2.5k full tokens of gpt-oss, 5% of them (one 64-token page) for a 128-token window; SGLang admits a
    # request only into more than window + page = 192 window tokens, so fp8's ~5k x 5% = 192 is refused too
    "window": ("gpt-oss-20b", dict(total=80 * GiB, free_before=80 * GiB, free_after=40 * GiB),
               {"kv_cache_memory": 64 * MiB, "page_size": 64, "swa_full_tokens_ratio": 0.05, "context_length": 1024,
                "max_running_requests": 4},
               BudgetBelowOneRequestError, {"swa-full-tokens-ratio", "kv-cache-memory"}),
    "state": (QWEN3_NEXT, dict(total=80 * GiB, free_before=80 * GiB, free_after=40 * GiB),
              {"kv_cache_memory": 200 * MiB}, BudgetBelowOneRequestError, {"kv-cache-memory"}),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_configure_suggests_values_that_work(scenario: str) -> None:
    model, card, args, error, flags = SCENARIOS[scenario]
    with pytest.raises(error) as info:
        configure(model, **card, **args)
    suggestions = info.value.suggestions
    assert {SUGGESTION.search(s).group(1) for s in suggestions if SUGGESTION.search(s)} == flags
    for suggestion in suggestions:
        fixed = applied(args, suggestion)
        result = configure(model, **card, **fixed)  # raises if the suggestion does not work
        plan = result.memory_pool_config
        assert result.allocated_bytes == plan.total_bytes <= plan.budget.budget_bytes
        if "tokens fit" in suggestion:
            assert f"({plan.max_total_num_tokens:,} tokens fit)" in suggestion


@pytest.mark.parametrize("scenario", ["fraction", "weights"])
def test_the_suggested_fraction_is_the_smallest_that_works(scenario: str) -> None:
    model, card, args, error, _ = SCENARIOS[scenario]
    with pytest.raises(error) as info:
        configure(model, **card, **args)
    (suggestion,) = [s for s in info.value.suggestions if s.startswith("--mem-fraction-static")]
    fraction = float(suggestion.split()[1])
    configure(model, **card, **{**args, "mem_fraction_static": fraction})
    with pytest.raises(DoesNotFitError):
        configure(model, **card, **{**args, "mem_fraction_static": round(fraction - 0.001, 3)})


def test_the_suggested_context_length_is_the_longest_that_works() -> None:
    model, card, args, error, _ = SCENARIOS["fraction"]
    with pytest.raises(error) as info:
        configure(model, **card, **args)
    (suggestion,) = [s for s in info.value.suggestions if s.startswith("--context-length")]
    context = int(suggestion.split()[1])
    assert context < 49152
    configure(model, **card, **{**args, "context_length": context})
    with pytest.raises(BudgetBelowOneRequestError):
        configure(model, **card, **{**args, "context_length": context + 1})


def test_the_suggested_kv_cache_memory_is_the_least_whole_mib_that_works() -> None:
    model, card, args, error, _ = SCENARIOS["kv-cache-memory"]
    with pytest.raises(error) as info:
        configure(model, **card, **args)
    (suggestion,) = [s for s in info.value.suggestions if s.startswith("--kv-cache-memory")]
    need = parse_bytes(suggestion.split()[1])
    assert need % MiB == 0  # a size a person types back
    configure(model, **card, **{**args, "kv_cache_memory": need})
    with pytest.raises(BudgetBelowOneRequestError):
        configure(model, **card, **{**args, "kv_cache_memory": need - MiB})


def test_the_error_message_lists_the_suggestions() -> None:
    model, card, args, error, _ = SCENARIOS["fraction"]
    with pytest.raises(error) as info:
        configure(model, **card, **args)
    text = str(info.value)
    assert "what would work:" in text
    assert all(f"    - {s}" in text for s in info.value.suggestions)
    assert "available: 3.90 GiB (4,183,298,146 B)" in text  # 11 GiB - round(24 GiB x 0.296)


def test_kv_cache_memory_too_large_suggests_a_value_that_works() -> None:
    args = {"kv_cache_memory": 20 * GiB}
    with pytest.raises(KVCacheMemoryTooLargeError) as info:
        configure("Llama-3.1-8B-Instruct", **CARD_24, **args)
    assert info.value.suggestions
    for suggestion in info.value.suggestions:
        if SUGGESTION.search(suggestion):
            configure("Llama-3.1-8B-Instruct", **CARD_24, **applied(args, suggestion))


def test_too_many_state_slots_suggests_a_count_that_works() -> None:
    card = dict(total=80 * GiB, free_before=80 * GiB, free_after=40 * GiB)
    args = {"kv_cache_memory": 10 * GiB, "max_mamba_cache_size": 1000}
    with pytest.raises(DoesNotFitError, match="more than the whole KV budget") as info:
        configure(QWEN3_NEXT, **card, **args)
    (suggestion,) = [s for s in info.value.suggestions if s.startswith("--max-mamba-cache-size")]
    configure(QWEN3_NEXT, **card, **applied(args, suggestion))


EAGLE3 = {"speculative_algorithm": "EAGLE3", "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}


def eagle_target(**args: Any) -> KVCacheConfigurator:
    """A Llama-3.1-8B target that pays for its EAGLE-3 head's pool, wired as EngineContainer wires it:
    the draft's layout uses the target's KV dtype and model dtype, with the draft pool prefix."""
    target = configurator("Llama-3.1-8B-Instruct", total=CARD_24["total"], free_after=CARD_24["free_after"],
                          **EAGLE3, **args)
    draft = load_model_config("EAGLE3-LLaMA3.1-Instruct-8B")
    draft_layout = worker_cache_layout(
        model_config=draft, parallel_state=target.parallel_state, kv_cache_dtype=target.kv_cache_dtype,
        model_dtype=target.model_dtype, layer_ids=target.parallel_state.layer_range(draft.num_hidden_layers),
        prefix=DRAFT_POOL_PREFIX,
    )
    return dataclasses.replace(target, draft_layout=draft_layout)


def test_a_target_pays_for_its_draft_pool() -> None:
    # one EAGLE-3 layer of 8 KV heads x (128 + 128) x 2 bytes (the target's bf16) = 4,096 B/token beside
    # the target's 131,072; rows hold context + SGLang's 4 + 3 steps + 1 draft tokens
    c = eagle_target(context_length=8192, kv_cache_memory=4 * GiB)
    plan = plan_pool_sizes(c.sizing.plan_request(c.sizing.layout(), memory_budget(4 * GiB)))
    assert [(p.name, p.bytes_per_token) for p in plan.kv_pools] == [("full", 131_072), ("draft_full", 4_096)]
    assert plan.bytes_per_token == 135_168
    assert plan.req_to_token_row_width == 8192 + 4 + 4
    assert plan.pool("draft_full").num_tokens == plan.max_total_num_tokens


def test_the_fp8_suggestion_counts_the_draft_in_fp8_too() -> None:
    # SGLang 0.5.23 reserves nothing extra for a draft: 0.704 on this card, a 3.90 GiB budget;
    # 32,768 tokens x 135,168 B need 4.13 GiB in bf16, half of that in FP8
    with pytest.raises(BudgetBelowOneRequestError) as info:
        eagle_target(context_length=32768).configure(pre_model_load_memory=CARD_24["free_before"])
    (suggestion,) = [s for s in info.value.suggestions if s.startswith("--kv-cache-dtype")]
    result = eagle_target(context_length=32768, kv_cache_dtype="fp8_e4m3").configure(
        pre_model_load_memory=CARD_24["free_before"])
    assert f"({result.max_total_num_tokens:,} tokens fit)" in suggestion


def test_a_token_cap_below_one_request_names_the_cap() -> None:
    # 60 GiB free of 80 at 0.836: a 46.88 GiB budget holds ~380k Llama tokens; the cap allows 4,096
    with pytest.raises(BudgetBelowOneRequestError, match="--max-total-tokens 4096") as info:
        configure("Llama-3.1-8B-Instruct", total=80 * GiB, free_before=80 * GiB, free_after=60 * GiB,
                  max_total_tokens=4096)
    assert info.value.needed_bytes < info.value.available_bytes


def test_a_plan_that_fits_is_what_configure_allocates() -> None:
    result = configure("gpt-oss-20b", total=80 * GiB, free_before=80 * GiB, free_after=60 * GiB,
                       mem_fraction_static=0.9, page_size=16)
    plan = result.memory_pool_config
    # keep round(80 GiB x 1/10) = 8 GiB free: 60 - 8 = 52 GiB of budget
    assert plan.budget.budget_bytes == 52 * GiB
    assert result.allocated_bytes == plan.total_bytes <= 52 * GiB
    assert result.max_total_num_tokens == plan.max_total_num_tokens == plan.pool("full").num_tokens


def test_one_request_in_a_paired_window_pool() -> None:
    # SGLang 0.5.23 charges a request min(its tokens, window) + page_size in the window pool: gpt-oss's 128-token
    # window, pages of 1 -> a 1,000-token request takes 128 + 1 = 129 tokens there, a 100-token one 100 + 1 = 101
    assert window_request_tokens(128, 1_000, 1) == 129
    assert window_request_tokens(128, 100, 1) == 101
    assert window_request_tokens(4_096, 131_072, 64) == 4_160  # gemma-2's window in pages of 64
