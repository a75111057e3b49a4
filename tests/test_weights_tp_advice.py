"""Weights that do not fit suggest a --tp-size that plans, checked by planning this worker's KV cache at that size.

DeepSeek-V2-Lite (29.5 GiB of bf16 weights) on an L4: TP 2 holds the weights (14.63 GiB a rank) but leaves
the KV cache nothing at the derived --mem-fraction-static 0.629, so the advice named a --tp-size that
was refused in turn (exit 3).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main

V2_LITE_ON_L4 = ["plan", "--model", "DeepSeek-V2-Lite", "--gpu", "L4"]
CORPUS = Path(__file__).with_name("model_corpus")


def _suggestions(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights" in err
    return err.split("what would work: ")[1].strip().split("; ")


def test_the_suggested_tp_size_plans(capsys: pytest.CaptureFixture[str]) -> None:
    first = _suggestions(V2_LITE_ON_L4, capsys)[0]
    assert first.startswith("--tp-size ") and "weights alone" not in first
    tp = first.split()[1]
    assert tp != "2"
    assert main([*V2_LITE_ON_L4, "--tp-size", tp]) == 0
    assert main([*V2_LITE_ON_L4, "--tp-size", str(int(tp) // 2)]) == 3  # the smallest that plans (16 heads: TP 2^k)


@pytest.mark.parametrize("argv", [
    # within 31 MB of planning at TP 2: the 92 MiB the CUDA context grows by at the first allocation decides it
    ["plan", "--model", str(CORPUS / "starcoder.json"), "--gpu", "L4"],
    ["plan", "--model", str(CORPUS / "gemma-3-27b-it.json"), "--gpu", "L4", "--kv-cache-dtype", "bfloat16"],
])
def test_the_check_counts_what_the_card_loses_at_the_first_allocation(argv: list[str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    first = _suggestions(argv, capsys)[0]
    assert first.startswith("--tp-size ") and "weights alone" not in first
    assert main([*argv, "--tp-size", first.split()[1]]) == 0
