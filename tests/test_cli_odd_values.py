"""Odd values an operator can type (over-long names, NUL bytes, sizes past any memory, unreadable files): each is
bad input, exit 2 with one line, never 'internal error' (exit 1)."""

from __future__ import annotations

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
    assert "cannot read" in refused(["plan", "--gpu", "H200", "--model", str(tmp_path)], capsys)


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
