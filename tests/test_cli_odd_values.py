"""Odd values an operator can type (over-long names, NUL bytes, sizes past any memory, unreadable files): each is
bad input, exit 2 with one line, never 'internal error' (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main

LONG = "x" * 5000  # past any file name (ENAMETOOLONG)
HUGE = "1" + "0" * 400  # past any float: 'GiB' shown as a float overflowed


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err, err
    return err


@pytest.mark.parametrize("argv", [
    ["plan", "--gpu", "H200", "--model", LONG],
    ["plan", "--gpu", "H200", "--model", "Qwen3-8B", "--speculative-algorithm", "EAGLE", "--speculative-draft-model", LONG],
    [LONG],
    ["plan", "--gpu", "H200", LONG],
])
def test_an_overlong_model_name_is_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert "x" * 40 in refused(argv, capsys)


def test_a_nul_byte_in_a_config_path_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert "config file" in refused(["plan", "--gpu", "H200", "--config", "a\x00b.toml"], capsys)


def test_an_unreadable_model_config_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").mkdir()  # a directory where the file should be: EISDIR
    assert "config.json is a directory, not a regular file" in refused(["plan", "--gpu", "H200", "--model", str(tmp_path)], capsys)


@pytest.mark.parametrize("argv", [
    ["plan", "--gpu", "H200", f"--kv-cache-memory={HUGE}GB"],
    [f"--memory-limit={HUGE}GB"],
])
def test_a_size_past_any_memory_is_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert "expected a size" in refused(argv, capsys)


def test_a_settings_file_size_past_any_memory_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "s.json"
    settings.write_text(f'{{"kv_cache_memory": {HUGE}}}')
    assert "kv_cache_memory" in refused(["plan", "--gpu", "H200", "--config", str(settings)], capsys)


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", "Qwen3-8B", "--tp-size=2", "--tensor-parallel-size", "4"], "--tp-size/--tensor-parallel-size is given twice with different values (2, 4)"),
    (["--model-path", "Qwen3-8B", "--model", "Llama-3.1-8B-Instruct"], "--model/--model-path is given twice"),
    (["--gpu", "H100-80GB"], "--gpu is given twice with different values ('H200', 'H100-80GB')"),
])
def test_a_flag_given_twice_with_different_values_is_refused(argv: list[str], says: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """argparse kept the last value: a plan for tp 4 (or the other model, card) exit 0, and the report shows no tp."""
    assert says in refused(["plan", "--gpu", "H200", *argv], capsys)


def test_a_flag_repeated_with_the_same_value_is_fine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "H200", "--model", "Qwen3-8B", "--tp", "2", "--tensor-parallel-size=2",
                 "--kv-cache-memory", "8GiB", "--kv-cache-memory", "8589934592"]) == 0


@pytest.mark.parametrize(("name", "text"), [
    ("s.toml", "mem_fraction_static = 0.5\nmem-fraction-static = 0.6\n"),
    ("s.json", '{"tp_size": 2, "tp_size": 4}'),
])
def test_a_setting_given_twice_with_different_values_is_refused(name: str, text: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The last one silently won (exit 0), as a repeated flag did."""
    settings = tmp_path / name
    settings.write_text(text)
    assert "twice with different values" in refused(["plan", "--gpu", "H200", "--config", str(settings)], capsys)


def test_an_abbreviated_json_flag_gets_the_json_error_object_too(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse takes --js for --json, so a plan printed JSON, but a failure printed no JSON object."""
    assert main(["plan", "--gpu", "H200", "--js", "--model", "nope"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["kind"] == "bad_input"
