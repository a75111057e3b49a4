"""What SGLang 0.5.23 itself would size for the plan's budget, beside the plan (it charges the request table and
allocator lists to its headroom, this plan to the budget): its configurator's one line, budget // bytes per token."""

from __future__ import annotations

import json

import pytest

from app.cli import main


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", "--gpu", "H200", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama_on_an_h200_sglang_sizes_the_whole_budget_in_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    r = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--kv-headroom", "fraction")
    assert r["budget_bytes"] == 118_802_840_682 and r["bytes_per_token"] == 131_072
    assert r["engine_own_tokens"] == 118_802_840_682 // 131_072 == 906_393
    # the plan's 892,220 is 14,173 tokens less: the 1,827,723,776 B request table and 28,551,168 B allocator lists it
    # charges, and the arena's rounding to 2 MiB
    assert r["max_total_num_tokens"] == 892_220
    charged = r["buffers"]["req_to_token"] + r["buffers"]["allocator_index"]
    assert 0 <= (906_393 - 892_220) * 131_072 - charged < 2 * 2**20 + 131_072


def test_mla_pages_and_a_token_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3 at TP 8: 61 layers x 576 bf16 latent entries = 70,272 B a token; 47,181,852,312 B hold 671,417
    tokens, 671,360 in whole 64-token pages."""
    r = _plan(capsys, "--model", "DeepSeek-V3", "--tp-size", "8", "--page-size", "64", "--kv-headroom", "fraction")
    assert (r["budget_bytes"], r["bytes_per_token"]) == (47_181_852_312, 61 * 576 * 2)
    assert r["engine_own_tokens"] == 671_360
    capped = _plan(capsys, "--model", "DeepSeek-V3", "--tp-size", "8", "--page-size", "64", "--kv-headroom", "fraction",
                   "--max-total-tokens", "100000")
    assert capped["engine_own_tokens"] == 100_000 // 64 * 64 == capped["max_total_num_tokens"]


@pytest.mark.parametrize("args", [
    ["--model", "Qwen3-Next-80B-A3B-Thinking", "--tp-size", "4"],  # a state pool: SGLang's rule is not that line
    ["--model", "gemma-2-9b-it", "--enable-hybrid-swa-memory"],  # two pools (full + window)
    ["--model", "Llama-3.1-8B-Instruct", "--engine", "vllm"],  # vLLM's answer is its own
    ["--model", "Llama-3.1-8B-Instruct", "--kv-cache-memory", "20GB"],  # SGLang 0.5.23 has no such budget
])
def test_where_the_engines_rule_is_not_one_line_nothing_is_said(args: list[str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _plan(capsys, *args).get("engine_own_tokens") is None


def test_the_text_report_says_why_the_counts_differ(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "H200", "--model", "Llama-3.1-8B-Instruct", "--kv-headroom", "fraction"]) == 0
    out = capsys.readouterr().out
    assert ("sglang 0.5.23 itself sizes 906,393 for the static plan's budget: it allocates the request table and the "
            "allocator's lists outside it, which this plan charges") in out


def test_a_resized_plans_budget_is_not_one_sglang_computes() -> None:
    """After a measured or post-capture resize the plan's budget is the measured one: SGLang's line is not said."""
    from kvcache.inputs.dtypes import BFLOAT16

    from kvcache.engines import engine_rules
    from kvcache.inputs.dtypes import KV_CACHE_DTYPES
    from kvcache.inputs.parallel import ParallelState
    from kvcache.inputs.sizing_settings import SizingSettings
    from kvcache.models.presets import load_model_config
    from kvcache.sizing.planning import plan_pool_sizes
    from kvcache.sizing.resized_plan import resized_plan_request
    from kvcache.sizing.worker_sizing import WorkerSizing
    from kvcache.sizing.worker_memory import WorkerMemory

    rules, settings = engine_rules("sglang"), SizingSettings()
    sizing = WorkerSizing(settings=settings, model_config=load_model_config("Llama-3.1-8B-Instruct"),
                          parallel_state=ParallelState(), model_dtype=BFLOAT16,
                          kv_cache_dtype=KV_CACHE_DTYPES["bfloat16"], device_type="cuda", engine=rules)
    plan = sizing.plan(WorkerMemory(total_bytes=150_109_880_320, free_before_load=149_458_911_232,
                                    free_after_load=133_300_355_072))
    assert rules.own_token_count(plan, settings) is not None
    resized = plan_pool_sizes(resized_plan_request(plan, plan.budget.budget_bytes * 9 // 10))
    assert rules.own_token_count(resized, settings) is None
