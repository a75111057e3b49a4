"""A state hybrid whose state share cannot hold one request is told the state knob that fixes it, checked by planning.

Before, both cases below fell through to "a larger --tp-size (or --pp-size)", which does not plan either:
the state share is a ratio of the budget (or a fixed slot count), whatever the TP size.
"""

from __future__ import annotations

import pytest

from app.cli import main

QWEN3_NEXT = ["plan", "--model", "Qwen3-Next-80B-A3B-Thinking", "--gpu", "H200", "--tp-size", "4"]
NEMOTRON_H = ["plan", "--model", "Nemotron-H-56B-Base-8K", "--gpu", "H200"]


def _suggestions(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.split("what would work: ")[1].strip().split("; ")


def test_a_state_ratio_too_small_for_one_request_suggests_the_least_ratio_that_plans(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Budget 94,040,497,455 B; one request needs 5 slots + the padding slot of 19,316,736 B = 115,900,416 B.
    A ratio r gives budget x r / (1 + r): 0.001 -> 93,946,551 B (4 slots), 0.002 -> 187,705,583 B (9 slots)."""
    suggestions = _suggestions([*QWEN3_NEXT, "--mamba-full-memory-ratio", "0.0001"], capsys)
    assert suggestions[0] == "--mamba-full-memory-ratio 0.002"
    assert main([*QWEN3_NEXT, "--mamba-full-memory-ratio", "0.002"]) == 0


def test_too_few_state_slots_for_one_request_suggests_one_request_s_slots(capsys: pytest.CaptureFixture[str]) -> None:
    suggestions = _suggestions([*NEMOTRON_H, "--max-mamba-cache-size", "1"], capsys)  # one request takes 5
    assert suggestions[0] == "--max-mamba-cache-size 5"
    assert main([*NEMOTRON_H, "--max-mamba-cache-size", "5"]) == 0
