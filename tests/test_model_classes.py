"""An architecture the engine has no model class for plans, with one note saying so (text and --json); the lists are
each engine's own (rebuilt from their sources where KVCACHE_REFERENCE_SRC names them)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from app.cli import main
from kvcache.engines.model_classes import model_classes
from kvcache.models.presets import PRESET_DIR
from reference_sources import reference_src_holding

NOTE = "has no model class for FooForCausalLM: it loads such a model only through its Transformers backend"


@pytest.fixture
def foo_config(tmp_path: Path) -> Path:
    """Llama-3.1-8B's config.json under an architecture neither engine has."""
    config = json.loads((PRESET_DIR / "Llama-3.1-8B-Instruct.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "architectures": ["FooForCausalLM"]}))
    return path


@pytest.mark.parametrize(("engine", "label"), [("sglang", "SGLang 0.5.23"), ("vllm", "vLLM 0.34.0")])
def test_an_architecture_without_a_model_class_plans_with_one_note(engine: str, label: str, foo_config: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", str(foo_config), "--gpu", "H200", "--engine", engine]
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if NOTE in line]
    assert notes == [f"note: {label} {NOTE}, where transformers or the config's auto_map provides the class, and "
                     "refuses it at start-up otherwise; this plan follows the layers config.json describes"]
    assert main([*argv, "--json"]) == 0
    assert [n for n in json.loads(capsys.readouterr().out)["engine_notes"] if NOTE in n] == [notes[0][len("note: "):]]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_known_architecture_says_nothing(engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H200", "--engine", engine, "--json"]) == 0
    assert not any("has no model class" in n for n in json.loads(capsys.readouterr().out)["engine_notes"])


def test_every_preset_has_a_class_in_both_engines() -> None:
    for path in PRESET_DIR.glob("*.json"):
        archs = set(json.loads(path.read_text())["architectures"])
        assert archs & model_classes("sglang", "0.5.23") and archs & model_classes("vllm", "0.34.0"), path.name


def _dict_keys(tree: ast.Module, name: str) -> set[str]:
    """The keys of a module-level dict literal, `**other` spreads followed."""
    literal = {t.id: n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets)
               if isinstance(t, ast.Name) and isinstance(n.value, ast.Dict)}[name]
    keys: set[str] = set()
    for key, value in zip(literal.keys, literal.values):
        if key is None and isinstance(value, ast.Name):
            keys |= _dict_keys(tree, value.id)
        elif isinstance(key, ast.Constant):
            keys.add(key.value)
    return keys


def test_sglangs_list_is_every_entry_class_of_its_models() -> None:
    root = reference_src_holding("sglang/srt/models/llama.py", "SGLang 0.5.23")
    names: set[str] = set()
    for path in (root / "sglang" / "srt" / "models").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                value = node.value
                for e in value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]:
                    names.add(e.id if isinstance(e, ast.Name) else e.attr)  # type: ignore[attr-defined]
    assert names == model_classes("sglang", "0.5.23")


def test_vllms_list_is_its_registry() -> None:
    root = reference_src_holding("vllm/model_executor/models/registry.py", "vLLM 0.34.0")
    tree = ast.parse((root / "vllm" / "model_executor" / "models" / "registry.py").read_text())
    assert _dict_keys(tree, "_VLLM_MODELS") == model_classes("vllm", "0.34.0")
