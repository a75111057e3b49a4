"""A --chunked-prefill-size or --cuda-graph-max-bs so large that the fraction SGLang derives from it leaves the KV
cache nothing: the refusal names the largest value that plans a full-length request, and that value plans."""

from __future__ import annotations

import json
import re

import pytest

from app.cli import main

LLAMA_ON_H100 = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"]


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main([*argv, "--json"]) == 3
    return json.loads(capsys.readouterr().out)["error"]


def _full_request_plans(argv: list[str], capsys: pytest.CaptureFixture[str]) -> bool:
    code = main([*argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    # the static plan (SGLang's fraction, what every refusal's fixes are checked by) holds Llama-3.1-8B's whole
    # 131,072-token context and more; a measured bootstrap holds more still
    return code == 0 and out["static_plan_tokens"] > 131_072


@pytest.mark.parametrize(("flag", "given", "step"), [("--chunked-prefill-size", 10_000_000, 1),
                                                     ("--cuda-graph-max-bs", 100_000, 1)])
def test_a_huge_reserve_knob_is_named_with_the_largest_value_that_plans(flag, given, step, capsys):
    error = _refusal([*LLAMA_ON_H100, flag, str(given)], capsys)
    assert "nothing is left for the KV cache" in error["message"]
    named = [s for s in error["suggestions"] if s.startswith(flag)]
    assert len(named) == 1, error["suggestions"]
    value = int(re.match(rf"{flag} (\d+) ", named[0]).group(1))  # type: ignore[union-attr]
    assert f"{given:,} keeps that memory free for the runtime" in named[0]
    assert 0 < value < given
    assert _full_request_plans([*LLAMA_ON_H100, flag, str(value)], capsys)  # the value named plans
    assert not _full_request_plans([*LLAMA_ON_H100, flag, str(value + step)], capsys)  # and is the largest


def test_a_chunk_named_stays_a_multiple_of_the_page(capsys):
    """SGLang asserts chunk % page == 0 at start-up: at --page-size 64 the chunk named is whole pages."""
    argv = [*LLAMA_ON_H100, "--page-size", "64", "--chunked-prefill-size", str(64 * 150_000)]
    named = [s for s in _refusal(argv, capsys)["suggestions"] if s.startswith("--chunked-prefill-size")]
    value = int(named[0].split()[1])
    assert value % 64 == 0
    assert _full_request_plans([*argv[:-1], str(value)], capsys)


def test_with_the_fraction_given_the_knob_is_not_the_cause_and_is_not_named(capsys):
    """--mem-fraction-static 0.05 is read as given: the chunk no longer moves the budget, so lowering it fixes
    nothing the line could promise."""
    error = _refusal([*LLAMA_ON_H100, "--mem-fraction-static", "0.05", "--chunked-prefill-size", "10000000"], capsys)
    assert not [s for s in error["suggestions"] if s.startswith("--chunked-prefill-size")]
