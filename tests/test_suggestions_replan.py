"""Every value a refusal suggests works: applied to the same command, it plans (exit 0), or, where the suggestion
says it is a first step (a --tp-size for the weights alone), the next refusal names a value again. Drawn by
Hypothesis over models, cards and the flags that make a setup tight, derandomized (the same examples every run).
On a host, the --memory-limit a refused bootstrap names holds the weights, the runtime's reserve and one
full-length request: with it the bootstrap runs (the case from the field: 15318MiB was 4,096 B short of the
weights, and the next answer had no number)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.cli import main
from kvcache.byte_units import MiB

EXAMPLES = settings(max_examples=14, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MODELS = ["Llama-3.1-8B-Instruct", "Qwen3-8B", "DeepSeek-V2-Lite", "gemma-2-9b-it", "Mistral-7B-v0.1",
          "Qwen3-Next-80B-A3B-Thinking", "gpt-oss-20b"]
CARDS = ["L4", "A10", "RTX-3090", "A100-40GB"]
POOL_BELOW_ONE_REQUEST = ["--context-length", "8192", "--max-total-tokens", "4096"]  # SGLang runs it, capped
TIGHTENERS: list[list[str]] = [[], ["--context-length", "131072"], ["--mem-fraction-static", "0.3"],
                               ["--kv-cache-memory", "1GiB"], ["--tp-size", "2"], ["--kv-cache-dtype", "bfloat16"]]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out.splitlines()[0]) if out.strip() else {}


def flags_of(suggestion: str) -> list[str]:
    """The flags a suggestion starts with and their values ('--a 1 --b x (why)' -> [--a, 1, --b, x]); [] for one
    that names no flag first (a host or card with more memory)."""
    words, flags = suggestion.split(), []
    while len(words) >= 2 and words[0].startswith("--") and not words[1].startswith("("):
        flags += words[:2]
        words = words[2:]
    return flags


def applied(argv: list[str], flags: list[str]) -> list[str]:
    """`argv` with each suggested flag's value replacing the one given (or added)."""
    out = list(argv)
    for name, value in zip(flags[::2], flags[1::2]):
        if name in out:
            out[out.index(name) + 1] = value
        else:
            out += [name, value]
    return out


@EXAMPLES
@given(model=st.sampled_from(MODELS), card=st.sampled_from(CARDS),
       tighteners=st.lists(st.sampled_from(TIGHTENERS), max_size=2, unique_by=lambda t: t[0] if t else ""))
def test_every_suggested_value_plans_when_applied(model: str, card: str, tighteners: list[list[str]],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", model, "--gpu", card, *[w for t in tighteners for w in t]]
    code, refused = run(argv, capsys)
    if code != 3:
        return
    suggestions = refused["error"]["suggestions"]
    assert suggestions, refused["error"]["message"]
    for suggestion in suggestions:
        flags = flags_of(suggestion)
        if not flags:
            continue
        again, answer = run(applied(argv, flags), capsys)
        if "the KV cache then needs more" in suggestion:  # a first step: the next refusal names a value again
            assert again == 0 or (again == 3 and any(flags_of(s) for s in answer["error"]["suggestions"])), suggestion
        else:
            assert again == 0, (argv, suggestion, answer.get("error"))


@EXAMPLES
@given(model=st.sampled_from(["Llama-3.1-8B-Instruct", "Mistral-7B-v0.1", "Qwen3-8B", "gemma-2-9b-it"]),
       card=st.sampled_from(["L4", "A10", "RTX-4090"]), tp=st.sampled_from(["1", "2"]),
       headroom=st.sampled_from(["fraction", "auto"]), pool_cap=st.sampled_from([[], POOL_BELOW_ONE_REQUEST]))
@example(model="Mistral-7B-v0.1", card="L4", tp="1", headroom="fraction", pool_cap=[])  # 9,339 tokens: capped
@example(model="Llama-3.1-8B-Instruct", card="L4", tp="2", headroom="fraction", pool_cap=[])  # 102,659 of 131,072
# a --max-total-tokens below the 8,192-token request where the budget holds more: the note names
# --max-total-tokens 8192 (checked by the planner's own strict plan, as its refusal names it)
@example(model="Llama-3.2-1B-Instruct", card="L4", tp="1", headroom="fraction", pool_cap=POOL_BELOW_ONE_REQUEST)
def test_every_fix_a_capped_request_is_given_holds_a_full_request(model: str, card: str, tp: str, headroom: str,
                                                                  pool_cap: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A plan whose pool is shorter than one full-length request runs with each request capped, and its note names
    values for a full-length request: each, applied, plans with no cap."""
    argv = ["plan", "--model", model, "--gpu", card, "--tp-size", tp, "--kv-headroom", headroom, *pool_cap]
    code, report = run(argv, capsys)
    if code != 0:
        return
    for note in report["capacity_notes"]:
        if note["cap"] != "request_length":
            continue
        for fix in note["fixes"]:
            again, answer = run(applied(argv, flags_of(fix)), capsys)
            assert again == 0 and answer["request_token_cap"] is None, (argv, fix, answer.get("error"))


@pytest.fixture
def host_of(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A host of `n` MiB whose free memory is its --memory-limit less what this process grew by (none of it taken by
    other processes: the probe's cap at MemAvailable would make the numbers this machine's load)."""
    def make(n: int) -> None:
        monkeypatch.setattr("app.worker_refusals.host_memory_bytes", lambda: n * MiB)
        monkeypatch.setattr("kvcache.sizing.worker_sizing.host_memory_bytes", lambda: n * MiB)
        monkeypatch.setattr("kvcache.memory.memory_probe._host_available_bytes", lambda: None)
    return make


@pytest.mark.parametrize("limit", ["300MiB", "1GiB"])
def test_the_memory_limit_a_host_refusal_names_runs_the_bootstrap(limit: str, host_of: Any,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2-135M (0.25 GiB of weights, 8,192-token requests of 23,040 B a token = 180 MiB): 300MiB does not hold
    the weights, 1GiB not the runtime's reserve beside them; each names a --memory-limit, and with it the bootstrap
    holds at least one full-length request."""
    host_of(64 * 1024)
    argv = ["--model", "SmolLM2-135M", "--device", "cpu", "--memory-limit", limit, "--cuda-graph-max-bs", "0"]
    code, refused = run(argv, capsys)
    assert code == 3
    (suggestion,) = [s for s in refused["error"]["suggestions"] if s.startswith("--memory-limit ")]
    assert suggestion.endswith("MiB (ServerArgs.memory_limit from Python; the least that holds the weights, the "
                               "runtime's reserve and one full-length request)") or "the least that fits" in suggestion
    code, report = run(applied(argv, flags_of(suggestion)), capsys)
    assert code == 0 and report["max_total_num_tokens"] >= 8192 and report["request_token_cap"] is None


def test_a_host_too_small_names_the_limit_that_would_work_and_what_it_has(host_of: Any,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B (14.96 GiB of weights) on a 24 GiB host: one 131,072-token request is 16 GiB of KV alone, so
    no limit the host allows plans; the line names the limit that would, and the host's size."""
    host_of(24 * 1024)
    code, refused = run(["--model", "Llama-3.1-8B-Instruct", "--device", "cpu"], capsys)
    assert code == 3
    (suggestion,) = refused["error"]["suggestions"]
    assert suggestion.startswith("a host with more memory: --memory-limit ") and suggestion.endswith(
        "MiB (ServerArgs.memory_limit from Python) is the least that holds the weights, the runtime's reserve and one "
        "full-length request; this host has "
        "24576MiB")
    needed = int(suggestion.split()[6].removesuffix("MiB")) * MiB
    assert needed > 16_062_087_168 + 131_072 * 131_072  # the weights and one full request of 128 KiB a token
