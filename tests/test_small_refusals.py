"""Issue 22's smaller items: each a clear line naming the flag, the right exit code, no noise."""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path

import pytest

from kvcache import silence_torch_numpy_warning  # importing the package installs it too
from app.cli import main
from app.weights import DummyWeightLoader
from kvcache.inputs.cards import KNOWN_CARDS


def test_a_card_family_name_suggests_its_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "H100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown card 'H100'; did you mean H100-80GB or H100-94GB?" in err


@pytest.mark.parametrize("rest", [
    ["--model", "NoSuchModel"],  # the model is never read
    ["--config", "nonexistent.toml"],  # nor the settings file
    ["--model", "/nonexistent", "--json"],  # the JSON error names the card too
])
def test_plan_names_an_unknown_card_before_anything_else(rest: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --gpu is read before the model and the settings: an operator who mistyped both learns of the
    card at once, with the cards that are known."""
    assert main(["plan", "--gpu", "Foo", *rest]) == 2
    captured = capsys.readouterr()
    line = f"kvcache: error: unknown card 'Foo'; known: {', '.join(KNOWN_CARDS)}; or give --gpu-memory 80GiB\n"
    assert captured.err == line
    if "--json" in rest:
        assert "unknown card 'Foo'" in json.loads(captured.out)["error"]["message"]
    else:
        assert captured.out == ""


def test_a_settings_file_s_bad_value_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "s.toml"
    settings.write_text("mem-fraction-static = 1.5\n")
    assert main(["plan", "--gpu", "H200", "--config", str(settings)]) == 2
    err = capsys.readouterr().err
    assert err == (f"kvcache: error: config file {settings}: mem-fraction-static = 1.5 is refused "
                   "(--mem-fraction-static, ServerArgs.mem_fraction_static): expected float < 1.0\n")
    assert main(["plan", "--gpu", "H200", "--config", str(settings), "--mem-fraction-static", "0.8"]) == 0  # flag wins


class _FullDisk:
    """A stdout on a full disk: every write fails as the kernel says ENOSPC."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_a_one_line_refusal_not_a_bug(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdout", _FullDisk())
    assert main(["plan", "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    assert err == ("kvcache: error: cannot write the report to stdout: No space left on device (errno 28); "
                   "free space there or redirect it elsewhere\n")


def test_weights_that_leave_no_kv_room_are_refused_before_any_is_filled(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # SmolLM2's 270,532,608 B of weights fit a 1 GiB host budget, but the fraction for a 1 GiB budget (the 0.05
    # floor) keeps 95% free: the KV cache cannot plan, which is known before a byte of weights is filled
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were filled before the refusal")

    monkeypatch.setattr(DummyWeightLoader, "load", never)
    assert main(["--device", "cpu", "--memory-limit", "1GiB", "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "does_not_fit" and "nothing is left for the KV cache" in error["message"]


def test_torch_s_numpy_warning_is_silenced_by_importing_the_package() -> None:
    # importing kvcache installs this filter; pytest may since have restored the filters it saw before collecting
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_torch_numpy_warning()
        warnings.warn("Failed to initialize NumPy: No module named 'numpy' (Triggered internally at tensor_numpy.cpp)",
                      UserWarning)
        warnings.warn("another warning", UserWarning)
    assert [str(w.message) for w in caught] == ["another warning"]
