"""`plan`'s dry run (app.dry_run: nothing built, no torch) reports what the engine's start-up on the meta device
reports, where the container loads meta weights and builds meta pools through ModelRunner and the configurator:
the same report, timings aside, and the same draft sizing; and a draft whose weights do not fit is refused."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

import msgspec
import pytest

from app.dry_run import dry_run
from app.plan_wiring import planned_workers, single_process_state
from app.rank_report import rank_plan
from app.report import build_report
from kvcache.inputs.cards import card_named
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import load_model_config

CASES = [
    ("Llama-3.1-8B-Instruct", "H200", {}),
    ("Llama-3.1-8B-Instruct", "H100-80GB", {"speculative_algorithm": "EAGLE3",
                                             "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}),
    ("DeepSeek-V3", "H200", {"tp_size": 8, "speculative_algorithm": "NEXTN", "kv_cache_dtype": "fp8_e4m3"}),
    ("Qwen3-Next-80B-A3B-Thinking", "H200", {"tp_size": 4}),
    ("gemma-2-9b-it", "H100-80GB", {"context_length": 4096}),
    ("Mamba-Codestral-7B-v0.1", "H100-80GB", {}),
]
REFUSED = [  # each refusal's line names a larger --tp-size, re-planned through ModelRunner's WorkerRefusals
    ("Llama-3.1-8B-Instruct", "L4", {}),  # the weights leave the runtime no room
    ("Mamba-Codestral-7B-v0.1", "A10", {}),  # the state share holds no request's slots
    ("Qwen3-Next-80B-A3B-Thinking", "H200", {}),  # the weights do not fit
]


def _without_timings(report: Any) -> dict[str, Any]:
    out = msgspec.to_builtins(report)
    out.pop("timings_s")
    if out["draft"] is not None:
        out["draft"].pop("timings_s")
    return out


@contextmanager
def meta_container(model: str, card: str, flags: dict[str, Any]) -> Iterator[tuple[Any, ServerArgs, ModelConfig]]:
    """The engine container on the meta device for `card` (what `plan` started before app.dry_run), its
    ServerArgs and model; its resources shut down afterwards."""
    from containers import EngineContainer

    server_args = ServerArgs.from_mapping({"device": "meta", **flags})
    config = load_model_config(model)
    container = EngineContainer(server_args=server_args, model_config=config, card=card_named(card))
    try:
        yield container, server_args, config
    finally:
        container.shutdown_resources()


@pytest.mark.parametrize(("model", "card", "flags"), CASES, ids=[f"{m}-{c}" for m, c, _ in CASES])
def test_the_dry_run_reports_what_the_meta_bootstrap_reports(model: str, card: str, flags: dict[str, Any]) -> None:
    with meta_container(model, card, flags) as (container, server_args, config):
        rules = container.engine_rules()
        engine = container.engine()
        engine.bootstrap()
        built = build_report(engine, rules=rules, card=card)
        built_rank = rank_plan(engine, built)
        draft_sizing = container.draft.configurator().sizing if engine.draft is not None else None
    run = dry_run(server_args, config, card_named(card), single_process_state(server_args))
    planned = build_report(run, rules=rules, card=card)
    assert _without_timings(planned) == _without_timings(built)
    assert set(planned.timings_s) == set(built.timings_s)  # the same phases, timed
    assert rank_plan(run, planned) == built_rank  # free memory after start-up included: weights and arenas debited
    assert (run.draft.sizing if run.draft is not None else None) == draft_sizing
    assert planned.allocated_bytes == sum(w.memory_pool_config.arena_bytes(draft=w.role == "draft")
                                          for w in run.workers)  # the arenas the plan states, as the builder carves


@pytest.mark.parametrize(("model", "card", "flags"), REFUSED, ids=[f"{m}-{c}" for m, c, _ in REFUSED])
def test_the_dry_run_refuses_what_the_meta_bootstrap_refuses(model: str, card: str, flags: dict[str, Any]) -> None:
    from kvcache.errors import DoesNotFitError

    with meta_container(model, card, flags) as (container, server_args, config), \
            pytest.raises(DoesNotFitError) as built:
        container.engine().bootstrap()
    with pytest.raises(type(built.value)) as planned:
        dry_run(server_args, config, card_named(card), single_process_state(server_args))
    assert str(planned.value) == str(built.value) and "--tp-size " in str(planned.value)
    assert planned.value.suggestions == built.value.suggestions


def test_a_draft_whose_weights_do_not_fit_is_refused_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu-memory 17GB (GiB: 18,253,611,008 B) has 17,602,641,920 B free before load (the CUDA context takes
    650,969,088 B); the 8B target's 16,062,087,168 B of weights and the 96,468,992 B of kernels loading adds leave
    1,444,085,760 B, less than the EAGLE3 draft's 1,902,116,864 B: exit 3, naming the draft's weights (the engine's
    own bootstrap refuses it with this line too: tests/test_cli_draft_refusal.py)."""
    from app.cli import main

    args = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "17GB", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B", "--json"]
    assert main(args) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["message"].startswith("EAGLE3-LLaMA3.1-Instruct-8B's draft weights (1.77 GiB (1,902,116,864 B) on "
                                       "this rank) do not fit in the 1.34 GiB (1,444,085,760 B) free on the card")
    wired = planned_workers(ServerArgs.from_mapping({"device": "meta", "speculative_algorithm": "EAGLE3",
                                                     "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}),
                            load_model_config("Llama-3.1-8B-Instruct"), single_process_state(ServerArgs.from_mapping({})))
    assert error["needed_bytes"] == wired.weights[1] == 1_902_116_864
