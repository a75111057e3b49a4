"""SGLang 0.5.23's own config classes on each config form of the corpus: which it runs, and the layers it sees.

Its classes (sglang/srt/configs/*.py) are loaded from the reference tree under the transformers installed
(SGLang 0.5.23 pins 5.19.0), with the two SGLang helpers they import stubbed; skipped without the tree or
without transformers 5.15+. Where SGLang builds the config, its attention / Mamba / KDA layers and KV heads
are ours; where it refuses a form (typed in from what its code does), ours still plans it, and SOURCES.md
says so.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kvcache.models.hf_config import model_config_from_hf
from reference_sources import reference_src_holding

CORPUS = Path(__file__).with_name("model_corpus")
# corpus file -> (SGLang 0.5.23's config file and class, what it does with the file)
FORMS: dict[str, tuple[str, str, str]] = {
    "dbrx-instruct": ("dbrx", "DbrxConfig", "runs"),
    "dbrx-instruct-transformers5": ("dbrx", "DbrxConfig", "Found unknown kwargs={'hidden_size': 6144}"),
    "granite-4.0-h-tiny-example": ("granitemoehybrid", "GraniteMoeHybridConfig", "runs"),
    "granite-4.0-h-tiny-example-transformers5": ("granitemoehybrid", "GraniteMoeHybridConfig", "runs"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("nemotron_h", "NemotronHConfig", "runs"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16-transformers5": ("nemotron_h", "NemotronHConfig",
                                                          "layers_block_type contains invalid types"),
    "Kimi-Linear-48B-A3B-Instruct": ("kimi_linear", "KimiLinearConfig", "runs"),
    "Kimi-Linear-48B-A3B-Instruct-transformers5": ("kimi_linear", "KimiLinearConfig",
                                                   "'NoneType' object is not subscriptable"),
}


@pytest.fixture
def sglang_config_class(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A loader of one SGLang config class from its file; its sglang imports are stubbed for the test only."""
    transformers = pytest.importorskip("transformers")
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    if (major, minor) < (5, 15):
        pytest.skip(f"transformers {transformers.__version__} predates 5.15's layer names (SGLang 0.5.23 pins 5.19.0)")
    root = reference_src_holding("sglang/srt/configs/dbrx.py", "SGLang 0.5.23") / "sglang" / "srt" / "configs"
    logging.getLogger("transformers").setLevel(logging.ERROR)
    helpers = {"sglang.srt.configs.mamba_utils": ("Mamba2CacheParams", "Mamba2StateShape", "mamba2_state_dtype",
                                                  "KimiLinearCacheParams", "KimiLinearStateShape"),
               "sglang.srt.runtime_context": ("get_parallel",)}
    for package in ("sglang", "sglang.srt", "sglang.srt.configs"):
        monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
    for name, attributes in helpers.items():
        module = types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, object)  # named by the imports; the checks below never call them
        monkeypatch.setitem(sys.modules, name, module)

    def load(file: str, cls: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"sglang_0523_{file}", root / f"{file}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, cls), transformers.PretrainedConfig._dict_from_json_file

    return load


def _sglang_layers(config: Any, file: str) -> dict[str, Any]:
    """What SGLang's sizing reads from its config: the layers of each cache kind (and DBRX's KV heads)."""
    if file == "dbrx":
        return {"kv_heads": config.attn_config.kv_n_heads, "head_dim": config.d_model // config.n_heads,
                "layers": config.n_layers}
    if file == "kimi_linear":
        return {"state": config.linear_layer_ids, "attention": config.full_attention_layer_ids,
                "kda_heads": config.linear_attn_config["num_heads"]}
    return {"state": config.mamba_layer_ids, "attention": config.full_attention_layer_ids}


def _our_layers(name: str, file: str) -> dict[str, Any]:
    m = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    if file == "dbrx":
        return {"kv_heads": m.num_key_value_heads, "head_dim": m.head_dim, "layers": m.num_hidden_layers}
    state = [i for i, k in enumerate(m.layer_kinds) if k in ("mamba2", "kda")]
    attention = [i for i, k in enumerate(m.layer_kinds) if k in ("full_attention", "mla")]
    if file == "kimi_linear":
        return {"state": state, "attention": attention, "kda_heads": m.linear_num_key_heads}
    return {"state": state, "attention": attention}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_sglang_runs_each_form_with_our_layers_or_refuses_it(name: str, sglang_config_class: Any) -> None:
    file, cls, outcome = FORMS[name]
    klass, read_json = sglang_config_class(file, cls)
    raw = {k: v for k, v in read_json(CORPUS / f"{name}.json").items() if k != "auto_map"}
    try:
        theirs = _sglang_layers(klass(**raw), file)
    except (ValueError, TypeError) as refused:
        assert outcome != "runs" and outcome in str(refused)
        return
    assert outcome == "runs"
    assert theirs == _our_layers(name, file)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_the_plan_says_so_exactly_where_sglang_refuses_the_file(name: str) -> None:
    # No reference tree needed: FORMS holds what SGLang 0.5.23's classes do with each file (checked above).
    from kvcache.engines.sglang import SGLANG

    notes = SGLANG.config_notes(model_config_from_hf(CORPUS / f"{name}.json"))
    refused = FORMS[name][2] != "runs"
    assert len(notes) == int(refused)
    if refused:
        assert notes[0].startswith("SGLang 0.5.23 refuses this config.json as written: ")
