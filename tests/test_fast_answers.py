"""Fast answers: `fit`, `presets`, `--help` and the planner import no torch (issue 33), and the torch-free wiring
`fit` plans with is the engine container's.

The check runs in this process, not polluted by other tests' imports: the `without_torch` fixture sets aside
every loaded module of the project and of torch, puts a finder first on sys.meta_path that refuses to import
torch or triton (an attempt fails with the importer in its traceback), imports the project afresh, and restores
everything afterwards.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest
from dependency_injector import providers

CORPUS = Path(__file__).parent / "model_corpus"
LLAMA_70B = str(CORPUS / "Meta-Llama-3.1-70B.json")
PROJECT = ("kvcache", "app", "containers")
DEVICE_LIBRARIES = ("torch", "triton")


class _RefuseDeviceLibraries(importlib.abc.MetaPathFinder):
    """Fails any import of torch or triton."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in DEVICE_LIBRARIES:
            raise ImportError(f"{name} was imported on a path that must answer without a device")


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh import of the project in which torch cannot be imported; the loaded modules come back afterwards."""
    for name in list(sys.modules):
        if name.split(".")[0] in PROJECT + DEVICE_LIBRARIES:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_RefuseDeviceLibraries(), *sys.meta_path])
    yield
    for name in list(sys.modules):  # the fresh copies go; monkeypatch puts the originals back
        if name.split(".")[0] in PROJECT + DEVICE_LIBRARIES:
            del sys.modules[name]


def test_the_fixture_refuses_torch(without_torch: None) -> None:
    with pytest.raises(ImportError, match="must answer without a device"):
        import torch  # noqa: F401
    assert "torch" not in sys.modules


def test_fit_presets_and_help_answer_without_torch(without_torch: None, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    assert main(["fit", "--model", LLAMA_70B, "--requests", "64", "--context-length", "32768"]) == 0
    assert "96 cells" in capsys.readouterr().out  # the default sweep: 12 cards x TP 1, 2, 4, 8 x 2 KV dtypes
    assert main(["fit", "--model", "Qwen3-8B", "--gpu", "H200", "--engine", "vllm", "--requests", "64",
                 "--max-model-len", "32768"]) == 0
    assert main(["presets"]) == 0
    assert main(["plan", "--help"]) == 0
    assert "torch" not in sys.modules


def test_the_planner_plans_every_preset_without_torch(without_torch: None) -> None:
    from app.fit_sweep import FitSweep, FitTarget
    from kvcache.inputs.cards import card_named
    from kvcache.models.presets import load_model_config, preset_names

    outcomes = {}
    for name in preset_names():
        sweep = FitSweep(model=load_model_config(name), settings={}, target=FitTarget(tokens=1))
        outcomes[name] = sweep.cell(card_named("H200"), 1, 1, "auto").outcome
    assert outcomes["Llama-3.1-8B-Instruct"] == "fits" and outcomes["DeepSeek-V3"] == "weights"  # 671B on one card
    assert "torch" not in sys.modules


def test_plan_answers_for_every_preset_and_both_engines_without_torch(without_torch: None,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Every shipped preset planned for an H200 under SGLang's rules and vLLM's, as --json; the two presets whose
    weights outweigh the card at --tp-size 1 (DeepSeek-V3's 671B parameters, mostly 1-byte fp8: 626.92 GiB; Qwen3-Next
    80B in bf16: 148.41 GiB, against the H200's 139.19 GiB free) are refused in one line, also without torch. Then a
    draft, pipeline stages and a refusal that searches for a larger --tp-size take their roads without it too."""
    from app.cli import main
    from kvcache.models.presets import preset_names

    too_big = {"DeepSeek-V3", "Qwen3-Next-80B-A3B-Thinking"}
    for engine in ("sglang", "vllm"):
        for name in preset_names():
            code = main(["plan", "--model", name, "--gpu", "H200", "--json", "--engine", engine])
            out = json.loads(capsys.readouterr().out)
            if name in too_big:
                assert code == 3 and out["error"]["kind"] == "does_not_fit", (engine, name)
                assert "weights" in out["error"]["message"] and out["error"]["suggestions"]
            else:
                assert code == 0 and out["engine"] == engine and out["max_total_num_tokens"] > 0, (engine, name)
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H200", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B"]) == 0
    assert main(["plan", "--model", "Qwen3-Next-80B-A3B-Thinking", "--gpu", "H200", "--tp-size", "2", "--pp-size", "2",
                 "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])["stages"]) == 2
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "L4"]) == 3  # 15 GiB of weights leave no room
    assert "what would work: --tp-size 2 (" in capsys.readouterr().err  # ... for the runtime: TP 2 re-planned
    assert "torch" not in sys.modules


@pytest.mark.parametrize(("model", "flags", "stage"), [
    ("Llama-3.1-8B-Instruct", {}, 0),
    ("Llama-3.1-8B-Instruct", {"speculative_algorithm": "EAGLE3", "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}, 0),
    ("DeepSeek-V3", {"tp_size": 8, "speculative_algorithm": "NEXTN", "kv_cache_dtype": "fp8_e4m3"}, 0),
    ("Qwen3-Next-80B-A3B-Thinking", {"tp_size": 2, "pp_size": 2}, 1),
    ("gemma-2-9b-it", {"context_length": 4096}, 0),
])
def test_fit_wires_each_worker_as_the_engine_container_does(model: str, flags: dict[str, Any], stage: int) -> None:
    from app.plan_wiring import planned_workers, single_process_state
    from containers import EngineContainer
    from kvcache.inputs.cards import card_named
    from kvcache.inputs.server_args import ServerArgs
    from kvcache.models.presets import load_model_config

    server_args = ServerArgs.from_mapping({"device": "meta", **flags})
    config = load_model_config(model)
    state = replace(single_process_state(server_args), pp_rank=stage)
    container = EngineContainer(server_args=server_args, model_config=config, card=card_named("H200"))
    container.parallel_state.override(providers.Object(state))
    try:
        engine = container.engine()
        weights = tuple(r._weight_loader().bytes_needed(r.weight_specs()) for r in engine.workers)
        wired = planned_workers(server_args, config, state)
        assert wired.sizing == container.target.configurator().sizing
        assert wired.weights == weights and len(weights) == (1 if "speculative_algorithm" not in flags else 2)
    finally:
        container.shutdown_resources()
