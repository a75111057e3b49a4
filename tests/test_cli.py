"""The command line: one subprocess smoke test for the real thing, every other case in-process through main()."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

import app.cli as cli

from app.cli import main
from kvcache.byte_units import GiB
from kvcache.memory.devices import resolve_device

REPO = Path(__file__).resolve().parents[1]
REQUIRED_KEYS = {"model", "device", "model_dtype", "kv_cache_dtype", "page_size", "bytes_per_token",
                 "max_total_num_tokens", "max_running_requests", "budget_bytes", "weights_bytes", "buffers"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_bootstrap_is_the_default_and_prints_a_report() -> None:
    """No command means bootstrap. The report's numbers are the CPU's (a 6 GiB host budget), so the test says
    --device cpu: without it a GPU host rightly bootstraps on CUDA (test_auto_device_is_cuda_when_present)."""
    done = run_cli("--device", "cpu", "--memory-limit", "6GiB", "--max-total-tokens", "16384")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "model               SmolLM2-135M" in out
    assert "device              cpu" in out
    assert "bytes per token     23,040" in out  # 30 layers x 3 KV heads x (64 + 64) x 2
    assert "max total tokens    16,384" in out
    assert "total allocated" in out and "load_weights" in out


def test_auto_device_is_cuda_when_present_else_the_cpu() -> None:
    """What bootstrap picks without --device: true on a laptop and on a GPU host alike."""
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == expected


@pytest.mark.parametrize(
    ("model", "card", "bytes_per_token"),
    [
        ("Llama-3.1-8B-Instruct", ["--gpu-memory", "80GiB"], 131_072),
        ("DeepSeek-V3", ["--gpu", "H200", "--tp-size", "8"], 70_272),
        ("gpt-oss-20b", ["--gpu", "A100-40GB"], 24_576),
    ],
)
def test_plan_json_for_cards_and_families(model: str, card: list[str], bytes_per_token: int,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", model, *card, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert REQUIRED_KEYS <= report.keys()
    assert report["device"] == "meta" and report["bytes_per_token"] == bytes_per_token
    assert sum(report["buffers"].values()) == report["planned_bytes"] == report["allocated_bytes"]
    assert report["planned_bytes"] <= report["budget_bytes"]


def test_plan_reports_both_speculative_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B", "--gpu-memory", "80GiB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_per_token"] == 131_072 + 4_096
    assert report["draft"]["pools"] == ["draft_full"]
    draft_arena = report["buffers"]["kv_draft_full"] + report["buffers"].get("draft_arena_padding", 0)
    assert draft_arena == report["draft"]["allocated_bytes"]  # the draft's one arena


def test_a_config_file_feeds_server_args_and_flags_override_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "server.toml"
    cfg.write_text('page-size = 16\nkv_cache_dtype = "fp8_e4m3"\nmax_total_tokens = 4096\n')
    assert main(["plan", "--gpu-memory", "24GiB", "--config", str(cfg), "--max-total-tokens", "8192", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["page_size"], report["kv_cache_dtype"], report["max_total_num_tokens"]) == (16, "fp8_e4m3", 8192)


def test_presets_lists_the_shipped_configs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M" in out and "Qwen3-Next-80B-A3B-Thinking" in out


def test_bad_input_exits_2_in_one_line_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "no-such-model", "--gpu-memory", "80GiB"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("kvcache: error: unknown model 'no-such-model'")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--gpu-memory", "80GiB", "--page-size", "0"], "argument --page-size: expected an integer >= 1 and <= 2147483647, got '0'"),
        (["plan", "--gpu-memory", "80GiB", "--kv-cache-dtype", "fp7"], "argument --kv-cache-dtype: invalid choice: 'fp7'"),
        (["plan", "--gpu", "H300"], "unknown card 'H300'"),
        (["plan", "--gpu", ""], "unknown card ''"),
        (["plan", "--gpu-memory", "80GiB", "--context-length", "100000"], "longer than SmolLM2-135M's max_position_embeddings 8192"),
        (["plan", "--gpu-memory", "80GiB", "--mem-fraction-static", "0.9", "--kv-cache-memory", "1GiB"], "give only one"),
    ],
)
def test_bad_values_exit_2_naming_the_problem(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_malformed_config_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    assert main(["plan", "--gpu-memory", "80GiB", "--model", str(bad)]) == 2
    assert "config.json is not valid JSON" in capsys.readouterr().err
    unknown = tmp_path / "m" / "config.json"
    unknown.parent.mkdir()
    unknown.write_text(json.dumps({"architectures": ["FancyNewForCausalLM"]}))
    assert main(["plan", "--gpu-memory", "80GiB", "--model", str(unknown.parent)]) == 2
    assert "m: config.json has no 'hidden_size'" in capsys.readouterr().err  # the generic reader names what is missing


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--gpu-memory", "80GiB", "--kv-cache-memory", "lots"], "cannot read 'lots' as a size"),
        (["plan", "--gpu-memory", "80GiB", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["plan"], "one of the arguments --gpu-memory --gpu is required"),
        (["plan", "--gpu-memory", "80GiB", "--page-size"], "argument --page-size: expected one argument"),
    ],
)
def test_argparse_errors_are_one_line_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: error: ") and message in err
    assert "usage:" not in err


def test_help_exits_0_and_is_not_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--gpu-memory" in out and "--mem-fraction-static" in out


@pytest.mark.parametrize(
    ("exc", "code", "kind", "text"),
    [
        (ZeroDivisionError("division by zero"), 1, "internal_error", "ZeroDivisionError: division by zero (a bug in kvcache"),
        (KeyError("num_layers"), 1, "internal_error", "KeyError: 'num_layers' (a bug"),
        (msgspec.ValidationError("Expected `int`, got `str` - at `$.x`"), 2, "bad_input", "Expected `int`, got `str`"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB"), 3, "does_not_fit",
         "out of memory: CUDA out of memory.; Tried to allocate 2 GiB"),
    ],
)
def test_any_exception_is_one_line_with_its_type(exc: BaseException, code: int, kind: str, text: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def explode(model: str) -> None:
        raise exc

    monkeypatch.setattr(cli, "load_model_config", explode)
    assert main(["plan", "--gpu-memory", "80GiB"]) == code
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and text in captured.err and "Traceback" not in captured.err
    assert main(["plan", "--gpu-memory", "80GiB", "--json"]) == code
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["kind"], error["exit_code"]) == (kind, code) and text in error["message"]


def test_json_failure_is_an_error_object_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "16GiB", "--json"]
    assert main(argv) == 3
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert error["kind"] == "does_not_fit" and error["exit_code"] == 3
    assert error["needed_bytes"] > error["available_bytes"] > 0
    assert error["suggestions"] and all(s.startswith("--") for s in error["suggestions"])
    assert captured.err.count("\n") == 1 and "what would work: --" in captured.err
    assert main(["plan", "--gpu-memory", "80GiB", "--page-size", "x", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error == {"kind": "bad_input", "exit_code": 2, "suggestions": [], "needed_bytes": None,
                     "available_bytes": None, "message": error["message"]}
    assert "--page-size" in error["message"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "16GiB"], "nothing is left for the KV cache"),
        (["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "8GiB"], "--tp-size 8"),  # TP 4 leaves less than the reserve
    ],
)
def test_does_not_fit_exits_3_with_values_that_work(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert message in err and "needed " in err and "available " in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "A100-40GB", "--mem-fraction-static", "0.4"],
         "--mem-fraction-static 0."),
        (["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "24GiB", "--mem-fraction-static", "0.9"],
         "--context-length"),
    ],
)
def test_a_pool_below_one_request_plans_capped_with_values_that_lift_the_cap(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang 0.5.23 runs a pool shorter than one 131,072-token request, capping each request at the pool less one."""
    assert main(argv) == 0
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if line.startswith("note: one request can hold at most ")]
    assert "not --context-length 131072" in note and message in note.split("for a full-length request: ")[1]


def test_every_suggested_value_really_lifts_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "24GiB", "--mem-fraction-static", "0.9"]
    assert main(base + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["request_token_cap"] == report["max_total_num_tokens"] - 1 < 131_072
    (note,) = [n for n in report["capacity_notes"] if n["cap"] == "request_length"]
    fixes = [s.split(" (")[0].split() for s in note["fixes"]]
    assert fixes, note
    for flag, value in fixes:
        argv = [a for a in base]
        if flag == "--mem-fraction-static":
            argv[argv.index(flag) + 1] = value
        elif flag == "--kv-cache-memory":
            argv = argv[:-2] + [flag, value]
        else:
            argv += [flag, value]
        assert main(argv + ["--json"]) == 0, (flag, value, capsys.readouterr().err)
        assert json.loads(capsys.readouterr().out)["request_token_cap"] is None, (flag, value)
    assert GiB  # sizes in messages are GiB for people, bytes for scripts


CORPUS = Path(__file__).parent / "model_corpus"


@pytest.mark.parametrize(
    ("config", "argv", "vision"),
    [
        ("Kimi-K2.5.json", ["--gpu-memory", "1TiB", "--tp-size", "8", "--page-size", "64"], "not_counted"),
        ("gemma-3-27b-it.json", ["--gpu", "H200"], "counted"),
    ],
)
def test_the_report_says_when_the_vision_tower_is_not_counted(
    config: str, argv: list[str], vision: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """Kimi-K2.5's config names a vision tower without its shapes; Gemma-3's gives them."""
    assert main(["plan", "--model", str(CORPUS / config), *argv]) == 0
    weights_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("weights "))
    assert ("vision tower not counted" in weights_line) == (vision == "not_counted")
    assert main(["plan", "--model", str(CORPUS / config), *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vision_weights"] == vision
