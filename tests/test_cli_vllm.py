"""`plan --engine vllm`: vLLM 0.34.0's blocks and max concurrency on a card, its knobs, and what it refuses.

Numbers by hand: an H200 is 150,109,880,320 B; at gpu_memory_utilization 1.0 vLLM's KV memory is that less
the weights and the runtime, a dry run's estimate of which is the project's reserve for the card
(13,904 MiB = 14,579,400,704 B on an H200, tests/test_vllm_plan.py). Qwen3-8B: 36 layers x 8 KV heads x
128 x 2 x 2 B = 147,456 B per token; a 64-token block of every layer is 9,437,184 B.
"""

from __future__ import annotations

import json

import pytest

from app.cli import main

H200 = 150_109_880_320
RUNTIME = 14_579_400_704
BLOCK = 9_437_184


def plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--engine", "vllm", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_answer_names_vllm_its_blocks_and_what_is_estimated(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(["--json", "--context-length", "32768"], capsys)
    report = json.loads(out)
    a = report["vllm"]
    assert code == 0 and (report["engine"], report["engine_version"]) == ("vllm", "0.34.0")
    assert report["estimated"] == ["estimated_runtime_bytes"] and a["estimated_runtime_bytes"] == RUNTIME
    assert a["available_bytes"] == H200 - a["weights_bytes"] - RUNTIME
    assert (a["block_size"], a["bytes_per_block"], a["blocks_per_request"]) == (64, BLOCK, 512)
    assert a["num_gpu_blocks"] == a["available_bytes"] // BLOCK
    assert a["max_concurrency"] == a["num_gpu_blocks"] / 512 and a["kv_cache_tokens"] == a["num_gpu_blocks"] * 64


def test_text_report_prints_blocks_concurrency_and_marks_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(["--gpu-memory-utilization", "0.9", "--block-size", "32", "--context-length", "32768"], capsys)
    assert code == 0
    assert "engine              vllm 0.34.0" in out and "x gpu_memory_utilization 0.9" in out
    assert "ESTIMATED" in out.split("runtime", 1)[1].splitlines()[0]
    assert "block size 32" in out and "blocks a request    1,024" in out and "max concurrency" in out


def test_a_card_too_small_is_refused_with_the_length_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--engine", "vllm"])
    err = capsys.readouterr().err
    assert code == 3 and "vLLM 0.34.0 would refuse to start" in err and "--context-length " in err
    longest = int(err.split("--context-length ")[1].split()[0])
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--engine", "vllm", "--context-length", str(longest)]) == 0
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--engine", "vllm",
                 "--context-length", str(longest + 64)]) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mem-fraction-static", "0.8"], "--mem-fraction-static: SGLang's knob, unused by --engine vllm; drop it"),
        (["--page-size", "16"], "--page-size: SGLang's knob, unused by --engine vllm; drop it (vLLM's: "
                                "--gpu-memory-utilization, --block-size"),
        (["--block-size", "24"], "--block-size 24 is not a multiple of 16"),
        (["--kv-cache-dtype", "fp4_e2m1"], "fp4_e2m1 is not modelled for --engine vllm"),
    ],
)
def test_knobs_vllm_has_no_use_for_are_refused(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan(argv, capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_vllm_knobs_need_the_vllm_engine_and_bootstrap_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--gpu-memory-utilization", "0.9"]) == 2
    assert "--gpu-memory-utilization is vLLM's knob: add --engine vllm, or with SGLang's rules use " \
           "--mem-fraction-static" in capsys.readouterr().err
    assert main(["--model", "SmolLM2-135M", "--device", "cpu", "--engine", "vllm"]) == 2
    assert "--engine vllm is a dry run of vLLM's block plan: use plan --engine vllm" in capsys.readouterr().err
    assert main(["fit", "--model", "Qwen3-8B", "--engine", "vllm", "--requests", "8", "--context-length", "4096"]) == 2
    assert "fit sweeps this engine's (SGLang's) plans" in capsys.readouterr().err


def test_weights_that_do_not_fit_suggest_a_tp_size_for_the_weights_alone(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V2-Lite's bf16 weights (31,413,239,808 B) overflow a 24 GiB card; vLLM's blocks at TP 2 are vLLM's own
    # answer, so the suggestion checks the weights alone (it once printed "--engine vllm plans vLLM's own blocks").
    assert main(["plan", "--engine", "vllm", "--model", "DeepSeek-V2-Lite", "--gpu-memory", "24GiB"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: does not fit: DeepSeek-V2-Lite's target weights (29.26 GiB")
    assert ("what would work: --tp-size 2 (about 14.66 GiB (15,743,320,064 B) per rank, for the weights alone: the "
            "KV cache then needs more)") in err
