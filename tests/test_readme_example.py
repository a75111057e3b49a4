"""The README's examples run as written, on the machine the README describes (the CPU within the 8 GiB default):
every `python -m app ...` command of its shell blocks (in-process, exit 0) and every Python block. The bare
`python -m app` (a CPU bootstrap) is left to tests/test_cli.py and .ci/run, which run it already."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from app.cli import main
from containers import EngineContainer
from kvcache.byte_units import GiB
from kvcache.inputs.server_args import ServerArgs
from kvcache.testing import FixedMemoryProbe, tiny_model_config

README = (Path(__file__).parents[1] / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


def _app_commands() -> list[list[str]]:
    """`python -m app ...` of the shell blocks, continuation lines joined, comments and `&&` chains split."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in " ".join(shlex.split(line, comments=True)).split(" && "):
                words = part.split()
                if words[:3] == ["python", "-m", "app"] and words[3:]:
                    commands.append(words[3:])
    return commands


def test_the_readme_has_examples_to_run() -> None:
    assert len(_app_commands()) >= 5 and len(_blocks("python")) >= 2


@pytest.mark.parametrize("argv", _app_commands(), ids=lambda a: " ".join(a)[:60] or "bootstrap")
def test_each_app_command_runs(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_each_python_block_runs(index: int, request: pytest.FixtureRequest) -> None:
    scope: dict[str, object] = {}
    exec(compile(_blocks("python")[index], f"README.md python block {index}", "exec"), scope)  # noqa: S102
    for name, test in list(scope.items()):  # a block that defines a test: run it with its fixtures
        if name.startswith("test_") and callable(test):
            test(request.getfixturevalue("mocker"))


def test_a_one_gib_card_holds_what_the_formula_says(mocker):
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "kv_cache_memory": GiB // 4}),
                             model_config=tiny_model_config())
    with engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB)):
        runner = engine.engine().target
        spy = mocker.spy(type(engine.target.configurator()), "configure")
        runner.initialize()
    assert spy.call_count == 1 and runner.memory_pool_config.total_bytes <= GiB // 4


def test_the_container_example_s_old_model_is_refused_before_filling_with_the_field_to_set(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.worker_refusals.host_memory_bytes", lambda: 64 << 30)  # a host that has the limit named
    # Llama-3.1-8B's 16,062,087,168 B of bf16 weights on the 8 GiB CPU default: refused before any is allocated,
    # naming the flag and the ServerArgs field (the README's example used to end in this traceback)
    assert main(["bootstrap", "--device", "cpu", "--model", "Llama-3.1-8B-Instruct"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(ServerArgs.memory_limit from Python;" in err
