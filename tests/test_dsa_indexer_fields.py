"""DeepSeek sparse-attention indexer settings that change SGLang 0.5.23's indexer key cache are refused.

SGLang sizes a token's indexer key at ceil((index_head_dim + index_head_dim / 128 x 4) / index_kpool) bytes
per layer, and gives no key to a layer that reuses the previous layer's top-k (index_topk_freq,
index_topk_pattern "S", indexer_types "shared", cli_factor). None of that is modelled: such a config
used to be planned at the default size (every layer, kpool 1), a silently wrong number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from kvcache.errors import ModelConfigFieldError
from kvcache.models.hf_config import model_config_from_hf

V32 = json.loads((Path(__file__).with_name("model_corpus") / "DeepSeek-V3.2.json").read_text())
LAYERS = V32["num_hidden_layers"]

REFUSED = [  # (field, value, what the message says is supported)
    ("index_kpool", 4, "expected 1: one indexer key per token"),
    ("index_kpool_compress", True, "expected false"),
    ("index_topk_freq", 2, "expected 1: every layer computes its own top-k"),
    ("cli_factor", 4, "expected 1: every layer computes its own top-k"),
    ("index_topk_pattern", "F" + "S" * (LAYERS - 1), "expected no 'S' entry"),
    ("indexer_types", ["full", "shared"] * (LAYERS // 2) + ["full"], "expected no 'shared' entry"),
    ("index_kpool", 0, "expected a positive integer"),
    ("indexer_types", 7, "expected a string or a list"),
]
SAME_AS_DEFAULT = [  # written out, the default values change nothing
    ("index_kpool", 1), ("index_kpool_compress", False), ("index_topk_freq", 1), ("cli_factor", 1),
    ("index_topk_pattern", "F" * LAYERS), ("indexer_types", ["full"] * LAYERS), ("index_skip_topk_offset", 3),
]


@pytest.mark.parametrize(("field", "value", "supported"), REFUSED, ids=lambda v: str(v)[:20])
def test_an_indexer_setting_that_changes_the_key_cache_is_refused_naming_it(field: str, value: Any,
                                                                            supported: str) -> None:
    with pytest.raises(ModelConfigFieldError) as caught:
        model_config_from_hf(V32 | {field: value})
    message = str(caught.value)
    assert f"config.json field '{field}' is " in message and supported in message, message
    assert str(value)[:20] in message


@pytest.mark.parametrize(("field", "value"), SAME_AS_DEFAULT, ids=lambda v: str(v)[:20])
def test_the_default_indexer_settings_written_out_plan_as_before(field: str, value: Any) -> None:
    model = model_config_from_hf(V32 | {field: value})
    assert model.index_head_dim == 128 and model.layer_kinds == ("mla",) * LAYERS


def test_the_cli_refuses_a_pooled_indexer_with_exit_2_in_one_line(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(V32 | {"index_kpool": 4}))
    assert main(["plan", "--model", str(config), "--gpu", "H200", "--tp-size", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: error: ") and "'index_kpool' is 4; expected 1" in err


@pytest.mark.parametrize(("extra", "refused_field"), [
    ({"indexer_types": ["full"] * LAYERS, "cli_factor": 4, "index_topk_freq": 2}, None),  # the list decides
    ({"indexer_types": ["full"] * LAYERS, "index_topk_pattern": "S" * LAYERS}, None),
    ({"index_topk_pattern": "F" * LAYERS, "index_topk_freq": 2}, None),  # the pattern decides before the frequency
    ({"cli_factor": 4, "index_topk_pattern": "F" * LAYERS}, "cli_factor"),  # cli_factor comes before the pattern
    ({"indexer_types": ["shared"] * LAYERS, "cli_factor": 1}, "indexer_types"),
])
def test_which_layers_reuse_top_k_is_decided_by_the_field_sglang_reads_first(extra: dict[str, Any],
                                                                              refused_field: str | None) -> None:
    """SGLang 0.5.23 reads indexer_types, then cli_factor > 1, then index_topk_pattern, then index_topk_freq; a field
    it never reads must not refuse a config whose deciding field says every layer keeps its key."""
    if refused_field is None:
        assert model_config_from_hf(V32 | extra).layer_kinds == ("mla",) * LAYERS
        return
    with pytest.raises(ModelConfigFieldError, match=f"'{refused_field}'"):
        model_config_from_hf(V32 | extra)
