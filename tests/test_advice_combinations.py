"""Where no single knob makes a plan fit, the advice names a combination that does, checked by planning with it.

The case from the field: Llama-3.1-8B on an L4. Its weights leave no KV room at the default
fraction 0.684, no fraction up to 0.99 holds a 131,072-token request, and no shorter context
helps at 0.684; before, the advice named only "a larger --tp-size or a bigger card".
"""

from __future__ import annotations

import json

import pytest

from app.cli import main
from kvcache.sizing.advice import round_shorter_contexts
from kvcache.sizing.knob_search import largest_passing, smallest_passing
from kvcache.byte_units import GiB
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest

LLAMA_ON_L4 = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "L4"]
QWEN3_NEXT_ON_L4 = ["plan", "--model", "Qwen3-Next-80B-A3B-Thinking", "--gpu", "L4", "--tp-size", "8"]
EAGLE3_ON_A10 = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "A10", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B"]


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one combination a refused plan suggests (exit 3, one stderr line), beside a larger --tp-size that plans
    at the defaults (kvcache.sizing.tp_advice), where there is one."""
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    suggestions = [s for s in err.split("what would work: ")[1].strip().split("; ") if not s.startswith("--tp-size ")]
    assert len(suggestions) == 1, suggestions
    return suggestions[0]


def flags_of(suggestion: str) -> dict[str, str]:
    assert " (together: " in suggestion, suggestion
    words = suggestion.split(" (together: ")[0].split()
    return dict(zip(words[::2], words[1::2]))


def tokens_of(suggestion: str) -> int:
    return int(suggestion.split(" (together: ")[1].split(" tokens fit")[0].replace(",", ""))


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def holds_a_full_request(argv: list[str], capsys: pytest.CaptureFixture[str]) -> bool:
    """Whether the plan holds one request of its whole context: not refused, and no per-request cap below it
    (SGLang 0.5.23 runs a shorter pool, each request capped at the pool less one token)."""
    if main([*argv, "--json"]) == 3:
        capsys.readouterr()
        return False
    return json.loads(capsys.readouterr().out)["request_token_cap"] is None


def as_argv(flags: dict[str, str]) -> list[str]:
    return [word for pair in flags.items() for word in pair]


def test_llama_on_an_l4_gets_a_fraction_with_a_shorter_context_that_plans(capsys: pytest.CaptureFixture[str]) -> None:
    suggestion = refusal(LLAMA_ON_L4, capsys)
    flags = flags_of(suggestion)
    assert set(flags) == {"--mem-fraction-static", "--context-length"}
    assert flags["--context-length"] == "32768"  # 65,536 bf16 tokens are 8 GiB, more than 0.99 of the card leaves
    plan = plan_json([*LLAMA_ON_L4, *as_argv(flags)], capsys)
    assert plan["max_total_num_tokens"] == tokens_of(suggestion) >= 32768
    assert plan["mem_fraction_static"] == float(flags["--mem-fraction-static"])
    # neither knob alone holds a full-length request, and the fraction is the least that does with that context
    for alone in (["--mem-fraction-static", flags["--mem-fraction-static"]], ["--context-length", "32768"]):
        assert not holds_a_full_request([*LLAMA_ON_L4, *alone], capsys)
    less = f"{float(flags['--mem-fraction-static']) - 0.001:.3f}"
    assert not holds_a_full_request([*LLAMA_ON_L4, "--mem-fraction-static", less, "--context-length", "32768"], capsys)


def test_fp8_kv_with_a_fraction_keeps_the_whole_context_when_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    suggestion = refusal(QWEN3_NEXT_ON_L4, capsys)
    flags = flags_of(suggestion)
    assert flags.keys() == {"--mem-fraction-static", "--kv-cache-dtype"} and flags["--kv-cache-dtype"] == "fp8_e4m3"
    plan = plan_json([*QWEN3_NEXT_ON_L4, *as_argv(flags)], capsys)
    assert plan["max_total_num_tokens"] == tokens_of(suggestion) and plan["context_length"] == 262144


def test_a_combination_for_a_target_and_its_draft_counts_both(capsys: pytest.CaptureFixture[str]) -> None:
    flags = flags_of(refusal(EAGLE3_ON_A10, capsys))
    plan = plan_json([*EAGLE3_ON_A10, *as_argv(flags)], capsys)
    assert plan["draft"] is not None and plan["context_length"] == int(flags["--context-length"])


def test_json_refusals_carry_the_combination(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LLAMA_ON_L4, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    # --tp-size 2 runs as SGLang runs it (102,660 tokens a rank: each request capped below the 131,072 context)
    assert [s.split(" (")[0] for s in error["suggestions"]] == ["--tp-size 2", "--mem-fraction-static 0.882 --context-length 32768"]
    # the larger fraction says what it gives up: (1 - 0.882) and (1 - 0.684) of the 21.89 GiB free before loading
    assert error["suggestions"][1].endswith("(together: 32,805 tokens fit, keeps 2.58 GiB free for activations and CUDA "
                                            "graphs where the default 0.684 keeps 6.92 GiB: it gives that headroom up)")
    assert error["suggestions"][0].endswith(", each request capped at 102,659 tokens)")
    assert plan_json([*LLAMA_ON_L4, "--tp-size", "2"], capsys)["request_token_cap"] == 102_659  # what TP 2 then plans
    assert main([*LLAMA_ON_L4, "--tp-size", "1"]) == 3


def _request(context: int, page: int) -> PlanRequest:
    budget = MemoryBudget(budget_bytes=GiB, total_bytes=2 * GiB, free_before_load_bytes=2 * GiB,
                          free_after_load_bytes=GiB, mem_fraction_static=0.9, kv_cache_memory_bytes=None)
    return PlanRequest(budget=budget, page_size=page, context_length=context, req_to_token_row_width=context,
                       kv_pools=(KVPoolDemand(name="full", kind="full", num_layers=1, bytes_per_token=64),))


@pytest.mark.parametrize(
    ("context", "page", "expected"),
    [
        (131072, 1, [65536, 32768, 16384, 8192, 4096, 2048, 1024]),  # a power of two: the next one down first
        (163840, 64, [131072, 65536, 32768, 16384, 8192, 4096, 2048, 1024]),
        (5000, 3000, [3000]),  # page multiples, each once: 4096 and 2048 -> 3000, 1024 -> none
        (1024, 1, []),
    ],
)
def test_round_shorter_contexts(context: int, page: int, expected: list[int]) -> None:
    assert round_shorter_contexts(_request(context, page)) == expected


@pytest.mark.parametrize(("lo", "hi", "boundary", "smallest", "largest"), [
    (1, 100, 37, 37, 36),  # ok is n >= 37 for smallest_passing, n < 37 (true then false) for largest_passing
    (1, 100, 1, 1, None),  # every n passes the first, none the second
    (1, 100, 101, None, 100),  # none passes the first, every n the second
    (5, 5, 5, 5, None),
])
def test_the_two_searches_find_the_boundary(lo: int, hi: int, boundary: int, smallest: int | None,
                                            largest: int | None) -> None:
    asked: list[int] = []

    def below(n: int) -> bool:
        asked.append(n)
        return n < boundary

    assert smallest_passing(lo, hi, lambda n: n >= boundary) == smallest
    assert largest_passing(lo, hi, below) == largest
    assert len(asked) <= (hi - lo + 1).bit_length() + 1  # a binary search, not a count
