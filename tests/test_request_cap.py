"""A pool shorter than one full-context request: SGLang 0.5.23 runs it, each request capped at the pool less one token.

SGLang's rules (srt/managers/tp_worker.py, srt/model_executor/pool_configurator.py): it warns when the pool holds
fewer tokens than --context-length and sets max_req_len = min(context - 1, pool - 1); it refuses only a pool of
no token ("Not enough memory"), one whose max_req_len is 0 (a pool of one token), and a sliding-window pool of
at most window + page tokens. `plan` follows that, saying what one request can hold and what would lift the cap;
the strict rule (refuse) stays what advice and `fit` check against. vLLM 0.34 refuses instead (its own test file).
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import msgspec
import pytest

from app.cli import main
from kvcache.byte_units import MiB
from kvcache.engines.sglang_minimums import SGLANG_MINIMUMS
from kvcache.errors import BudgetBelowOneRequestError
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.sizing.arena_sizes import slot_size
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest
from kvcache.sizing.resized_plan import resized_plan_request

SCOUT = "tests/model_corpus/Llama-4-Scout-17B-16E-Instruct.json"


def request(budget_bytes: int, pools: tuple[KVPoolDemand, ...], *, context: int, **kwargs: Any) -> PlanRequest:
    budget = MemoryBudget(budget_bytes=budget_bytes, total_bytes=budget_bytes, free_before_load_bytes=budget_bytes,
                          free_after_load_bytes=budget_bytes, mem_fraction_static=None, kv_cache_memory_bytes=budget_bytes)
    return PlanRequest(budget=budget, page_size=1, context_length=context, req_to_token_row_width=context,
                       kv_pools=pools, **kwargs)


def full(bytes_per_token: int) -> KVPoolDemand:
    return KVPoolDemand(name="full", kind="full", num_layers=1, bytes_per_token=bytes_per_token)


def test_a_pool_shorter_than_one_request_plans_with_each_request_capped() -> None:
    # 10 MiB (one arena, 10,485,760 B), one pool of 256 B/token, one running request of a 65,536-token row:
    #   table 2 x 65,536 x 4 = 524,288 B; pool S((T + 1) x 256); allocator index 2 x S(16 T) (S: up to 512 B)
    #   T = 34,587: 524,288 + 8,854,528 + 2 x 553,472 = 10,485,760, the whole arena
    #   T = 34,588: the pool's 8,854,784 B take a 8,855,040 B slot: 10,486,272 B, over it
    req = request(10 * MiB, (full(256),), context=65_536, max_running_requests=1)
    with pytest.raises(BudgetBelowOneRequestError, match="holds 34,587 tokens, fewer than one request"):
        plan_pool_sizes(req)  # the strict rule
    plan = plan_pool_sizes(msgspec.structs.replace(req, below_one_request="cap"))
    assert (plan.max_total_num_tokens, plan.request_token_cap, plan.max_running_requests) == (34_587, 34_586, 1)
    assert plan.total_bytes == 10 * MiB and plan.to_dict()["request_token_cap"] == 34_586
    at_context = plan_pool_sizes(request(10 * MiB, (full(256),), context=1024, max_running_requests=1))
    assert at_context.request_token_cap is None  # 1,024 tokens a row: the pool holds more than one request


def test_a_pool_of_one_token_is_refused_as_sglang_refuses_it() -> None:
    # 4 MiB a token: T = 1 costs a pool slot of 2 x 4 MiB, a 512 B table slot (two rows of 4 int32) and 2 x 512 B
    # of allocator index, 8,390,144 B in the 10 MiB arena; T = 2 needs a 12 MiB pool. max_req_len = 1 - 1 = 0.
    req = request(10 * MiB, (full(4 * MiB),), context=4, below_one_request="cap", minimums=SGLANG_MINIMUMS)
    with pytest.raises(BudgetBelowOneRequestError, match="budget holds 1 token, below the 2 the engine starts with"):
        plan_pool_sizes(req)
    two = plan_pool_sizes(request(10 * MiB, (full(3 * MiB),), context=4, below_one_request="cap",
                                  minimums=SGLANG_MINIMUMS))
    assert (two.max_total_num_tokens, two.request_token_cap) == (2, 1)  # 3 x 3 MiB + 512 + 1,024 B fit


@pytest.mark.parametrize("below_one_request", ["refuse", "cap"])
def test_a_window_pool_must_hold_more_than_a_window_and_a_page(below_one_request: str) -> None:
    """validate_swa_pool_size: SGLang refuses window + page >= swa tokens, whatever the context."""
    window_pool = KVPoolDemand(name="swa", kind="swa", num_layers=1, bytes_per_token=256, window=1, share="swa")
    req = request(10 * MiB, (full(256), window_pool), context=512, max_running_requests=1,
                  swa_ratio=Fraction(1, 100), below_one_request=below_one_request)
    have = plan_pool_sizes(req).pool("swa").num_tokens
    at = msgspec.structs.replace(window_pool, window=have - 1)  # have == window + page (1)
    with pytest.raises(BudgetBelowOneRequestError, match=f"holds {have} tokens, not more than one window \\({have - 1}\\)"):
        plan_pool_sizes(msgspec.structs.replace(req, kv_pools=(full(256), at)))
    below = msgspec.structs.replace(window_pool, window=have - 2)
    assert plan_pool_sizes(msgspec.structs.replace(req, kv_pools=(full(256), below))).pool("swa").num_tokens == have


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_mistral_7b_on_an_l4_runs_with_each_request_capped(capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang keeps Mistral-7B-v0.1 in one full pool: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B a token.
    # The budget holds 712 arenas of 2 MiB (1,493,172,224 B); the table takes 2,049 rows of 32,768 + 4 int32
    # (268,599,312 B, 268,599,808 page aligned) and the allocator 299,008 B: (T + 1) x 131,072 <= 1,224,273,408,
    # so T = 9,339 < 32,768
    argv = ["plan", "--model", "Mistral-7B-v0.1", "--gpu", "L4", "--kv-headroom", "fraction"]  # SGLang's static plan
    report = plan_json(argv, capsys)
    assert report["budget_bytes"] // (2 * MiB) == 712 and report["bytes_per_token"] == 131_072
    assert report["buffers"]["req_to_token"] == slot_size(2049 * (32768 + 4) * 4) and report["buffers"]["allocator_index"] == 299_008
    assert (report["static_plan_tokens"], report["request_token_cap"]) == (9_339, 9_338)
    (note,) = [n for n in report["capacity_notes"] if n["cap"] == "request_length"]
    assert note["message"].startswith("one request can hold at most 9,338 tokens") and note["tokens"] == 32_768 - 9_338
    context = [f for f in note["fixes"] if f.startswith("--context-length ")]
    assert context and note["fixes"][0].startswith("--mem-fraction-static 0.")
    shorter = int(context[0].split()[1])  # the longest context whose request fits
    assert plan_json([*argv, "--context-length", str(shorter)], capsys)["request_token_cap"] is None
    assert plan_json([*argv, "--context-length", str(shorter + 1)], capsys)["request_token_cap"] is not None
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "max total tokens    9,339  (below the 32,768-token context: one request holds at most 9,338)" in text
    assert "note: one request can hold at most 9,338 tokens" in text


def test_vllm_refuses_what_sglang_runs_and_names_the_length_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    # an RTX-4090 at TP 1 (at TP 2 vLLM's estimated start-up, its profile run a step of 2,048 tokens on a card
    # under 70 GiB, leaves room for one request of 131,072)
    argv = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "RTX-4090", "--tp-size", "1"]
    assert plan_json(argv, capsys)["request_token_cap"] is not None  # SGLang 0.5.23: runs, capped below 131,072
    assert main([*argv, "--engine", "vllm"]) == 3  # vLLM 0.34: one request of max_model_len must fit
    err = capsys.readouterr().err
    assert "would refuse to start" in err and "(the longest that fits, as vLLM estimates it)" in err


def test_scout_at_its_ten_million_token_context(capsys: pytest.CaptureFixture[str]) -> None:
    """The request table the plan charges: SGLang's default rows (2,048) of 10,485,760 int32 are 80 GiB, more than
    the 40 GiB budget, so the pools get only what min(2,048, T // 2) rows leave: T = 2,029, a window pool of
    align_down(2,029 x 4/5) = 1,623 tokens, not more than Llama-4's 8,192-token chunk + a page: SGLang refuses that."""
    argv = ["plan", "--model", SCOUT, "--gpu-memory", "300GB", "--kv-cache-memory", "40GB"]
    assert main([*argv, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["message"].startswith("the sliding-window pool 'swa' holds 1,623 tokens, not more than one window (8,192)")
    (fewer,) = [s for s in error["suggestions"] if s.startswith("--max-running-requests ")]
    requests = int(fewer.split()[1])
    assert plan_json([*argv, "--max-running-requests", str(requests)], capsys)["request_token_cap"] is not None
    assert main([*argv, "--max-running-requests", str(requests + 1)]) == 3
    capsys.readouterr()
    # 16 rows: the table is 17 x (10,485,760 + 4) x 4 = 713,031,952 B (713,032,192 aligned); a token costs 12 x 4,096 full + 4/5 x 36 x 4,096
    # window bytes = 167,116.8 B, so at most (40 GiB - 713,032,192) / 167,116.8 = 252,736 tokens (less the allocator)
    report = plan_json([*argv, "--max-running-requests", "16"], capsys)
    t = report["max_total_num_tokens"]
    assert report["buffers"]["req_to_token"] == 713_032_192
    assert 252_736 * 99 // 100 < t <= 252_736 and report["request_token_cap"] == t - 1
    assert [p["num_tokens"] for p in report["plan"]["kv_pools"]] == [t, t * 4 // 5]


def test_a_measured_headline_and_its_notes_describe_the_same_pools(capsys: pytest.CaptureFixture[str]) -> None:
    """At the defaults an L4's start measures its headroom: the headline is the predicted plan, which holds a
    full 32,768-token request where SGLang's static plan (9,339 tokens) caps each one; the cap, its note and the
    buffers' caption follow the headline, not the static plan beside it."""
    argv = ["plan", "--model", "Mistral-7B-v0.1", "--gpu", "L4"]
    report = plan_json(argv, capsys)
    assert report["max_total_num_tokens_source"].startswith("prediction_") and report["static_plan_tokens"] == 9_339
    assert report["max_total_num_tokens"] >= 32_768 and report["request_token_cap"] is None
    assert not [n for n in report["capacity_notes"] if n["cap"] == "request_length"]
    assert main(argv) == 0
    assert "buffers:  (the static plan's, as this dry run builds them; a measured bootstrap resizes them to the " \
           "headline)" in capsys.readouterr().out


@pytest.mark.parametrize("rule", ["cap", "refuse"])
def test_a_re_plan_caps_requests_only_where_the_planner_capped_them(rule: str) -> None:
    # One pool of 4,096 B/token, one request of 4,096 tokens. Within 10 MiB (one arena, 10,485,760 B), T = 2,531:
    # table 2 x 4,096 x 4 = 32,768 B, pool S(2,532 x 4,096) = 10,371,072 B, allocator index 2 x S(16 x 2,531) =
    # 81,920 B: the whole arena, and fewer than one request. Within 20 MiB, 5,071 tokens: a full request.
    # The planner records on the plan which rule a re-plan follows: a plan it capped stays capped, a plan of a full
    # request (whatever the rule it was planned with) is not re-planned below one.
    small = request(10 * MiB, (full(4096),), context=4096, max_running_requests=1, below_one_request="cap")
    capped = plan_pool_sizes(small)
    assert (capped.max_total_num_tokens, capped.request_token_cap, capped.below_one_request) == (2_531, 2_530, "cap")
    assert capped.buffers == {"req_to_token": 32_768, "allocator_index": 81_920, "kv_full": 10_371_072}
    again = plan_pool_sizes(resized_plan_request(capped, 10 * MiB))  # re-planned as it was: still capped
    assert (again.max_total_num_tokens, again.request_token_cap, again.below_one_request) == (2_531, 2_530, "cap")

    whole = plan_pool_sizes(msgspec.structs.replace(small, budget=request(20 * MiB, (), context=1).budget,
                                                    below_one_request=rule))
    assert (whole.max_total_num_tokens, whole.request_token_cap, whole.below_one_request) == (5_071, None, "refuse")
    with pytest.raises(BudgetBelowOneRequestError, match="holds 2,531 tokens, fewer than one request"):
        plan_pool_sizes(resized_plan_request(whole, 10 * MiB))


def test_a_max_total_tokens_fix_is_named_only_where_the_planner_plans_it() -> None:
    # A full pool and a window pool (128-token window, 4/5 of the tokens), 100-token requests, --max-total-tokens 64
    # in 64 MiB: the budget holds far more, but 100 tokens leave the window pool align_down(100 x 4/5) = 80, not
    # more than 128 + 1, so the planner refuses that value too (the window floor): no --max-total-tokens is named.
    # With a 16-token window 80 > 16 + 1 admits a request: --max-total-tokens 100 is named, and it plans.
    def pools(window: int) -> tuple[KVPoolDemand, ...]:
        return (full(1024), KVPoolDemand(name="swa", kind="swa", num_layers=1, bytes_per_token=1024, window=window,
                                         share="swa"))
    for window, named in ((128, False), (16, True)):
        req = request(64 * MiB, pools(window), context=100, max_total_tokens=64, max_running_requests=1)
        with pytest.raises(BudgetBelowOneRequestError) as refused:
            plan_pool_sizes(req)
        fixes = [s for s in refused.value.suggestions if s.startswith("--max-total-tokens")]
        assert fixes == (["--max-total-tokens 100 or more (or drop it)"] if named else []), window
        if named:
            assert plan_pool_sizes(msgspec.structs.replace(req, max_total_tokens=100)).max_total_num_tokens == 100
