"""`plan --pp-size N` plans every stage as its rank would under torchrun and reports what the ranks agree on.

Numbers from issue 22: before, `plan` sized stage 0 alone (DeepSeek-V3 on an H200 at PP 8 printed 7,630,223
tokens); every rank keeps the smallest stage's count. Bytes per token by hand, per stage:
Stages split as SGLang 0.5.23's get_pp_indices splits them, the extra layers on the LAST stages.
- DeepSeek-V3: 61 layers over 8 stages = 7,7,7,8,8,8,8,8; MLA (512 + 64) * 2 B = 1,152 B a layer.
- Jamba-v0.1 (hybrid): 32 layers = 10,11,11; attention at layers 4, 12, 20, 28 (period 8, offset 4); stages 0-9,
  10-20, 21-31 hold 1, 2, 1 of them at 8 KV heads * (128 + 128) * 2 B = 4,096 B; stage 1 is the smallest.
- Kimi-Linear (hybrid, MLA + KDA): 27 layers = 9,9,9; MLA at 1-based 4, 8, ..., 24 and 27, so stages hold
  2, 2, 3 MLA layers of 1,152 B; stage 2 is the smallest.
Every stage plans with the ranks' smallest free memory (the heaviest stage's weights), as ranks do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main

CORPUS = Path(__file__).with_name("model_corpus")

CASES = {
    "DeepSeek-V3 H200 PP 8": (["--model", "DeepSeek-V3", "--gpu", "H200", "--pp-size", "8"], 4_085_149,
                              [(0, 7), (7, 14), (14, 21), (21, 29), (29, 37), (37, 45), (45, 53), (53, 61)],
                              [8064] * 3 + [9216] * 5, {3, 4, 5, 6, 7}),
    "Jamba-v0.1 H200 PP 3": (["--model", str(CORPUS / "Jamba-v0.1.json"), "--gpu", "H200", "--pp-size", "3"], 5_820_513,
                             [(0, 10), (10, 21), (21, 32)], [4096, 8192, 4096], {1}),
    "Kimi-Linear H100 PP 3": (["--model", str(CORPUS / "Kimi-Linear-48B-A3B-Instruct.json"), "--gpu", "H100-80GB",
                               "--pp-size", "3"], 5_110_912, [(0, 9), (9, 18), (18, 27)], [2304, 2304, 3456], {2}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_holds_the_smallest_stage_s_tokens(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    flags, agreed, layers, bytes_per_token, smallest = CASES[case]
    assert main(["plan", *flags, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stages = report["stages"]
    assert [tuple(s["layers"]) for s in stages] == layers
    assert [s["bytes_per_token"] for s in stages] == bytes_per_token
    assert report["max_total_num_tokens"] == agreed  # stage 0's report, as rank 0 prints it
    assert all(s["max_total_num_tokens"] == agreed for s in stages)
    own = [s["own_max_total_num_tokens"] for s in stages]
    assert min(own) == agreed and {i for i, n in enumerate(own) if n == agreed} == smallest
    assert all(s["planned_bytes"] <= s["budget_bytes"] for s in stages)
    # a stage that alone holds more leaves budget idle: at least the tokens it gave up, at its bytes per token
    for s in stages:
        assert s["budget_bytes"] - s["planned_bytes"] >= (s["own_max_total_num_tokens"] - agreed) * s["bytes_per_token"]


def test_the_text_report_names_the_stages(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *CASES["Jamba-v0.1 H200 PP 3"][0]]) == 0
    out = capsys.readouterr().out
    assert "max total tokens    5,820,513" in out
    assert ("stages: pp 3; each stage plans with the ranks' smallest free memory after load (stage 2's, as SGLang "
            "0.5.23 takes the MIN over every rank), then every rank holds the smallest stage's 5,820,513 tokens "
            "(stage 1)") in out
    assert out.count("\n  stage ") == 3 and "own plan 11,595,907 tokens" in out


def test_the_engine_s_own_count_is_the_smallest_stage_s(capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang 0.5.23 sizes each stage's pool as budget // that stage's bytes per token (no request table charged)
    # and the ranks MIN-reduce it: DeepSeek-V3 at PP 8 is held to a 8-layer stage's 8 x 1,152 = 9,216 B/token,
    # 40,466,238,669 // 9,216 = 4,390,867 (stage 0's 7 layers alone would say 5,018,134), above the plan's 4,085,149
    assert main(["plan", *CASES["DeepSeek-V3 H200 PP 8"][0], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["engine_own_tokens"] for s in report["stages"]] == [5_018_134] * 3 + [4_390_867] * 5
    assert report["budget_bytes"] == 40_466_238_669 and report["engine_own_tokens"] == 4_390_867
    # Llama-3.1-8B split 1,31: stage 1's 31 layers x 8 KV heads x (128 + 128) x 2 B = 126,976 B/token;
    # 120,738,098,184 // 126,976 = 950,873 (stage 0's one layer of 4,096 B alone said 29,477,074)
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H200", "--pp-size", "2",
                 "--pp-layer-partition", "1,31"]) == 0
    out = capsys.readouterr().out
    assert "KV budget           112.45 GiB (120,738,098,184 B)" in out
    assert "sglang 0.5.23 itself sizes 950,873 for the static plan's budget" in out


def test_one_stage_has_no_stages(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "DeepSeek-V3", "--gpu", "H200", "--tp-size", "8", "--json"]) == 0
    assert "stages" not in json.loads(capsys.readouterr().out)


def test_a_stage_that_does_not_fit_fails_every_stage_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V3 at PP 2 on an H200: stage 0's 31 layers of fp8 experts alone are ~300 GiB
    assert main(["plan", "--model", "DeepSeek-V3", "--gpu", "H200", "--pp-size", "2"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: does not fit: rank 0 (tp 0/1, pp 0/2)")


def test_a_tp_size_that_plans_is_not_contradicted_by_a_no_card_line(capsys: pytest.CaptureFixture[str]) -> None:
    # the last stage holds 54 of DeepSeek-V3's 61 layers: ~580 GiB of weights, more than any known card at TP 1;
    # at --tp-size 8 each rank holds about an eighth (73 GiB) and the stage plans, so "no known card holds the
    # weights ... at this --tp-size" would only contradict the value named
    flags = ["plan", "--model", "DeepSeek-V3", "--gpu", "H200", "--pp-size", "8",
             "--pp-layer-partition", "1,1,1,1,1,1,1,54"]
    assert main(flags) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "what would work: --tp-size 8 (about 73.42 GiB" in err
    assert "no known card" not in err
    assert main([*flags, "--tp-size", "8"]) == 0


def test_more_stages_than_layers_are_refused_before_any_stage_starts(capsys: pytest.CaptureFixture[str]) -> None:
    # one thread (and one gather slot) a stage: 2**31 - 1 stages took 20 GB of host memory before this check
    assert main(["plan", "--gpu", "H200", "--pp-size", "2147483647"]) == 2
    err = capsys.readouterr().err
    assert err == ("kvcache: error: 30 layers cannot be split over --pp-size 2147483647; use at most 30\n")
