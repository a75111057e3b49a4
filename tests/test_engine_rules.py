"""Engine rules (kvcache.engines): one field picks the engine a plan is for; the report names it."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from kvcache.engines import ENGINES, engine_rules
from kvcache.errors import ConfigError
from kvcache.inputs.server_args import ServerArgs


def test_sglang_0_5_23_is_the_default_engine() -> None:
    assert ServerArgs().engine == "sglang"
    rules = engine_rules("sglang")
    assert (rules.name, rules.version, rules.label) == ("sglang", "0.5.23", "SGLang 0.5.23")


def test_every_engine_choice_of_the_flag_has_an_entry() -> None:
    assert set(ENGINES) == {"sglang", "vllm"}


def test_the_report_names_the_engine_and_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200"]) == 0
    assert "engine              sglang 0.5.23" in capsys.readouterr().out
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["engine"], report["engine_version"]) == ("sglang", "0.5.23")


def test_vllm_rules_answer_with_their_own_blocks_and_build_no_pools(capsys: pytest.CaptureFixture[str]) -> None:
    rules = engine_rules("vllm")
    assert (rules.name, rules.version, rules.label) == ("vllm", "0.34.0", "vLLM 0.34.0")
    with pytest.raises(ConfigError, match="^--engine vllm plans vLLM's own blocks, not this engine's pools"):
        rules.plan(None)  # type: ignore[arg-type]
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--engine", "vllm"]) == 0
    assert "engine              vllm 0.34.0" in capsys.readouterr().out
