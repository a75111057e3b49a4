"""A recurrent layer's fields, missing or bad, are one typed line (exit 2), never an AssertionError.

The config.json readers refuse a missing field; the layer specs refuse it again for a ModelConfig
built or replaced by hand (a library user), where an `assert` was an AssertionError and, under
`python -O`, no check at all (a negative group count gave a negative conv width).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app.cli import main
from kvcache.inputs.dtypes import BFLOAT16, resolve_kv_cache_dtype
from kvcache.errors import ModelConfigFieldError
from kvcache.sizing.layer_specs import model_layer_specs
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.models.presets import load_model_config

PRESETS = Path(__file__).resolve().parents[1] / "kvcache" / "models" / "presets"


def _specs(model: ModelConfig) -> Any:
    return model_layer_specs(model, ParallelState(), resolve_kv_cache_dtype("auto", BFLOAT16),
                             model_dtype=BFLOAT16)


@pytest.mark.parametrize(
    ("preset", "field", "value", "expected"),
    [
        ("Qwen3-Next-80B-A3B-Thinking", "linear_num_value_heads", None, "a positive integer"),
        ("Qwen3-Next-80B-A3B-Thinking", "linear_key_head_dim", 0, "a positive integer"),
        ("Qwen3-Next-80B-A3B-Thinking", "linear_conv_kernel_dim", None, "an integer of at least 2"),
        # a kernel of 1 would make an empty conv state: refused here too, for a ModelConfig built by hand
        ("Qwen3-Next-80B-A3B-Thinking", "linear_conv_kernel_dim", 1, "an integer of at least 2"),
        ("Nemotron-H-56B-Base-8K", "mamba_conv_kernel", 1, "an integer of at least 2"),
        ("Nemotron-H-56B-Base-8K", "ssm_state_size", None, "a positive integer"),
        ("Nemotron-H-56B-Base-8K", "mamba_head_dim", 0, "a positive integer"),
        ("Nemotron-H-56B-Base-8K", "mamba_n_groups", None, "an integer of at least 0"),
        # passed the old assert (it only tested `is not None`): the conv width came out negative
        ("Nemotron-H-56B-Base-8K", "mamba_n_groups", -8, "an integer of at least 0"),
        ("Nemotron-H-56B-Base-8K", "mamba_conv_kernel", True, "an integer of at least 2"),
    ],
)
def test_a_bad_state_field_is_a_typed_one_line_error(preset: str, field: str, value: Any, expected: str) -> None:
    model = msgspec.structs.replace(load_model_config(preset), **{field: value})
    with pytest.raises(ModelConfigFieldError) as caught:
        _specs(model)
    message = str(caught.value)
    assert f"ModelConfig field '{field}' is {value!r}; expected {expected}" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("preset", "field", "shown"),
    [
        ("Qwen3-Next-80B-A3B-Thinking", "linear_num_value_heads", "'linear_num_value_heads'"),
        ("Nemotron-H-56B-Base-8K", "ssm_state_size", "'ssm_state_size' (nor 'mamba_d_state', 'state_size')"),
    ],
)
def test_the_cli_refuses_a_config_missing_a_state_field_with_exit_2(
    preset: str, field: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    config = json.loads((PRESETS / f"{preset}.json").read_text())
    del config[field]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", "--model", str(path), "--gpu-memory", "80GiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config.json has no {shown}; expected a positive integer" in err
