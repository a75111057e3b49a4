"""Every sample of output the README shows is what the program prints: each ```-block that starts with
`$ python -m app ...` is run in-process and compared line by line (a `...` line stands for printed lines left out,
a line ending in `...)` for the rest of that line). The CPU bootstrap's lines that follow this process's resident
memory are compared by their words, as the README says; every other line exactly, numbers included. The quick
start's counts of presets and bundled configs are the folders'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import main
from kvcache.models.presets import PRESET_DIR, preset_names

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
SAMPLES = re.findall(r"^```\n\$ python -m app(.*?)^```", README, flags=re.S | re.M)
# the CPU bootstrap's lines that move with this process's resident set (README: "What it prints")
WITH_THE_RESIDENT_SET = ("free before load", "free after load", "KV budget", "max total tokens", "sglang ",
                         "allocator_index", "kv_full", "arena_padding", "total planned", "total allocated", "pool ",
                         "timings:")


def sample(block: str) -> tuple[list[str], list[str]]:
    """(the command's arguments after `python -m app`, the lines shown as its output)."""
    lines = block.split("\n")
    command = lines.pop(0)
    while command.endswith("\\"):
        command = command[:-1] + " " + lines.pop(0).strip()
    return command.split(), lines[:-1]  # the block ends with the last line's newline


def words(line: str) -> str:
    return re.sub(r"\d[\d,.]*", "#", line)


def same(shown: str, printed: str, *, loose: bool) -> bool:
    if shown.endswith("...)"):
        return printed.startswith(shown.removesuffix("...)"))
    if loose and shown.strip().startswith(WITH_THE_RESIDENT_SET):
        return words(shown) == words(printed)
    return shown == printed


def compare(shown: list[str], printed: list[str], *, loose: bool) -> None:
    """Each shown line is the next printed one; after a `...` line, one further down."""
    at, skipping = 0, False
    for line in shown:
        if line == "...":
            skipping = True
            continue
        while skipping and at < len(printed) and not same(line, printed[at], loose=loose):
            at += 1
        assert at < len(printed), f"the README shows {line!r}, which the program does not print"
        assert same(line, printed[at], loose=loose), f"README: {line!r}\nprinted: {printed[at]!r}"
        at, skipping = at + 1, False
    assert skipping or at == len(printed), f"the program prints more than the README shows: {printed[at:]}"


def test_the_readme_shows_samples_of_each_command() -> None:
    assert {sample(b)[0][0] if sample(b)[0] else "bootstrap" for b in SAMPLES} >= {"bootstrap", "fit", "plan"}


@pytest.mark.parametrize("block", SAMPLES, ids=lambda b: " ".join(sample(b)[0])[:50] or "bootstrap")
def test_each_sample_is_what_the_program_prints(block: str, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    argv, shown = sample(block)
    # the machine the README describes: no GPU (a CUDA host's bootstrap picks cuda:0), the 8 GiB limit free (the
    # probe would also cap it at what this loaded host has available)
    monkeypatch.setattr("kvcache.memory.memory_probe._host_available_bytes", lambda: None)
    if not argv:
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.chdir(ROOT)  # a --model path is the repository's
    assert main(argv) == 0, capsys.readouterr().err
    compare(shown, capsys.readouterr().out.splitlines(), loose=not argv)


def test_the_quick_start_counts_the_presets_and_bundled_configs() -> None:
    presets = int(re.search(r"the (\d+) presets \(kvcache/models/presets/\)", README).group(1))  # type: ignore[union-attr]
    corpus = int(re.search(r"tests/model_corpus/ holds (\d+) more config\.json", README).group(1))  # type: ignore[union-attr]
    assert presets == len(preset_names()) == len(list(PRESET_DIR.glob("*.json")))
    assert corpus == len(list((ROOT / "tests" / "model_corpus").glob("*.json")))


def test_the_quick_start_is_at_most_ten_lines_at_the_top() -> None:
    top = README.split("\n## ", 1)[0].split("\n\n")  # the title, then the quick start's block
    assert top[0] == "# kvcache-configurator" and top[1].startswith("```bash\n")
    assert len(top[0].splitlines()) + len(top[1].splitlines()) <= 10
