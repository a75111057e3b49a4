"""Every bad model-config field is refused with one line naming the field, the value and what is expected:
at the library level (a ConfigError subclass) and through the CLI (exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.cli import main
from kvcache.errors import ConfigError, ModelConfigFieldError, UnsupportedModelError
from kvcache.models.presets import PRESET_DIR, preset_names
from kvcache.models.hf_config import model_config_from_hf

LLAMA = "Llama-3.1-8B-Instruct"


def raw(name: str) -> dict[str, Any]:
    return json.loads((PRESET_DIR / f"{name}.json").read_text())


def edited(name: str, edit: dict[str, Any]) -> dict[str, Any]:
    """The preset with fields set (a value of ... removes the field)."""
    hf = raw(name)
    for key, value in edit.items():
        if value is ...:
            del hf[key]
        else:
            hf[key] = value
    return hf


_CONV_KERNEL_1 = ("field '{}' is 1; expected an integer from 2 to 64: the conv state keeps kernel - 1 columns, "
                  "so a kernel of 1 leaves nothing to cache")
CASES: list[tuple[str, dict[str, Any], str]] = [
    (LLAMA, {"num_hidden_layers": ...}, "config.json has no 'num_hidden_layers' (nor 'n_layer', 'num_layers', 'n_layers'); "
                                        "expected a positive integer"),
    (LLAMA, {"intermediate_size": ...}, "config.json has no 'intermediate_size' (nor 'ffn_hidden_size', 'n_inner', 'ffn_dim')"),
    (LLAMA, {"num_attention_heads": 0}, "field 'num_attention_heads' is 0; expected a positive integer (at most 16,384)"),
    (LLAMA, {"hidden_size": -4096}, "field 'hidden_size' is -4096; expected a positive integer"),
    (LLAMA, {"num_key_value_heads": 2.5}, "field 'num_key_value_heads' is 2.5; expected a positive integer"),
    (LLAMA, {"num_hidden_layers": True}, "field 'num_hidden_layers' is True; expected a positive integer (at most 10,000), "
                                         "not a boolean"),
    (LLAMA, {"vocab_size": "128256"}, "field 'vocab_size' is '128256'; expected a positive integer"),
    (LLAMA, {"num_key_value_heads": 6}, "field 'num_key_value_heads' is 6; expected a divisor of num_attention_heads (32)"),
    (LLAMA, {"head_dim": 0}, "field 'head_dim' is 0; expected a positive integer"),
    (LLAMA, {"num_hidden_layers": 10**9}, "field 'num_hidden_layers' is 1000000000; expected a positive integer (at most 10,000)"),
    (LLAMA, {"hidden_size": 10**12}, "field 'hidden_size' is 1000000000000; expected a positive integer (at most 1,048,576)"),
    (LLAMA, {"hidden_size": 4001, "head_dim": None}, "field 'num_attention_heads' is 32; expected a divisor of hidden_size (4001)"),
    (LLAMA, {"torch_dtype": "bfloat17"}, "field 'torch_dtype' is 'bfloat17'; expected the name of a torch dtype"),
    (LLAMA, {"torch_dtype": 16}, "field 'torch_dtype' is 16; expected the name of a torch dtype"),
    (LLAMA, {"tie_word_embeddings": "yes"}, "field 'tie_word_embeddings' is 'yes'; expected true or false"),
    (LLAMA, {"architectures": "LlamaForCausalLM"}, "field 'architectures' is 'LlamaForCausalLM'; expected a list"),
    (LLAMA, {"architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True},
     "architecture 'T5ForConditionalGeneration' is not a decoder-only language model"),
    (LLAMA, {"sliding_window": 0}, "field 'sliding_window' is 0; expected a positive integer"),
    (LLAMA, {"rms_norm_eps": "1e-5"}, "field 'rms_norm_eps' is '1e-5'; expected a positive, finite number"),
    (LLAMA, {"rope_theta": 0}, "field 'rope_theta' is 0; expected a positive, finite number"),
    (LLAMA, {"layer_types": ["full_attention"] * 3}, "field 'layer_types' is 'a list of 3'; expected one entry per layer (32)"),
    (LLAMA, {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
     "field 'quantization_config.weight_block_size' is [128]; expected two positive integers"),
    (LLAMA, {"quantization_config": 5}, "field 'quantization_config' is 5; expected a JSON object"),
    ("DeepSeek-V3", {"kv_lora_rank": None}, "config.json has no 'kv_lora_rank'"),
    ("DeepSeek-V3", {"n_routed_experts": -1}, "field 'n_routed_experts' is -1; expected an integer from 0 to 16,384"),
    ("DeepSeek-V3", {"index_topk": 2048, "index_head_dim": 100, "index_n_heads": 64},
     "field 'index_head_dim' is 100; expected a multiple of 128"),
    ("Qwen3-Next-80B-A3B-Thinking", {"linear_conv_kernel_dim": 0}, "field 'linear_conv_kernel_dim' is 0"),
    # a conv kernel of 1 would cache an empty conv state (it used to plan, then fail to build: exit 1)
    ("Qwen3-Next-80B-A3B-Thinking", {"linear_conv_kernel_dim": 1}, _CONV_KERNEL_1.format("linear_conv_kernel_dim")),
    ("Nemotron-H-56B-Base-8K", {"conv_kernel": 1}, _CONV_KERNEL_1.format("conv_kernel")),
    ("Nemotron-H-56B-Base-8K", {"mamba_num_heads": [256]}, "field 'mamba_num_heads' is [256]; expected a positive integer"),
    ("gpt-oss-20b", {"layer_types": None, "sliding_window": "128"}, "field 'sliding_window' is '128'"),
    (LLAMA, {"quantization_config": {"quant_method": "fp8", "ignore": ["lm_head", "re:.*mlp(.*"]}},
     "field 'quantization_config.ignore[1]' is 're:.*mlp(.*'; expected a valid regular expression after 're:'"),
]


@pytest.mark.parametrize(("name", "edit", "message"), CASES, ids=[f"{n}-{','.join(e)}" for n, e, _ in CASES])
def test_a_bad_field_is_refused_naming_field_value_and_need(name: str, edit: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError) as info:
        model_config_from_hf(edited(name, edit), name=name)
    assert message in str(info.value)
    assert str(info.value).startswith(f"{name}: ") and "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "edit", "message"), CASES[::4], ids=[f"{n}-{','.join(e)}" for n, e, _ in CASES[::4]])
def test_the_cli_exits_2_with_the_same_line(name: str, edit: dict[str, Any], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(edited(name, edit)))
    assert main(["plan", "--model", str(tmp_path), "--gpu", "H100-80GB"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_numerics_for_the_forward_pass_are_read_once() -> None:
    m = model_config_from_hf(raw(LLAMA))
    assert (m.rms_norm_eps, m.rope_theta) == (1e-5, 500000.0)
    nested = edited(LLAMA, {"rope_theta": ..., "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert model_config_from_hf(nested).rope_theta == 1e6


@pytest.mark.parametrize(("corpus", "field"), [("Jamba-v0.1", "mamba_d_conv"), ("Falcon-H1-0.5B-Base", "mamba_d_conv"),
                                               ("Kimi-Linear-48B-A3B-Instruct", "short_conv_kernel_size")])
def test_every_family_refuses_a_conv_kernel_of_1(corpus: str, field: str) -> None:
    hf = json.loads((_CORPUS / f"{corpus}.json").read_text())
    section = hf.get("linear_attn_config") if field == "short_conv_kernel_size" else hf
    assert section is not None and section[field] >= 2
    section[field] = 1
    with pytest.raises(ModelConfigFieldError) as info:
        model_config_from_hf(hf, name=corpus)
    path = "linear_attn_config." if section is not hf else ""
    assert _CONV_KERNEL_1.format(path + field) in str(info.value)


def test_field_errors_are_config_errors() -> None:
    assert issubclass(ModelConfigFieldError, UnsupportedModelError) and issubclass(ModelConfigFieldError, ConfigError)


@pytest.mark.parametrize(("edit", "value"), [
    ({"num_key_value_heads": None}, 32),  # null is absent: MHA
    ({"num_key_value_heads": 8.0}, 8),  # an integral float is an integer
    ({"num_key_value_heads": ..., "multi_query": True}, 1),
    ({"num_key_value_heads": ..., "num_kv_heads": 4}, 4),  # Falcon's alias
])
def test_tolerated_spellings(edit: dict[str, Any], value: int) -> None:
    assert model_config_from_hf(edited(LLAMA, edit)).num_key_value_heads == value


# ---- random mutations never escape as anything but exit 0, 2 or 3 -----------------------------------------

_VALUES = st.sampled_from([None, 0, -3, 1, "x", True, 0.5, 2.0, [], {}, [1, "a"], {"a": 1}, 10**12])


_CORPUS = Path(__file__).with_name("model_corpus")
_SOURCES = [PRESET_DIR / f"{n}.json" for n in preset_names()] + sorted(_CORPUS.glob("*.json"))


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A preset or corpus config with 1-3 fields removed or replaced (inside text_config half the time)."""
    source = json.loads(draw(st.sampled_from(_SOURCES)).read_text())
    hf = source["text_config"] if isinstance(source.get("text_config"), dict) and draw(st.booleans()) else source
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(hf)))
        if isinstance(hf[key], dict) and hf[key] and draw(st.booleans()):
            hf[key] = {**hf[key], draw(st.sampled_from(sorted(hf[key]))): draw(_VALUES)}
        elif draw(st.booleans()):
            del hf[key]
        else:
            hf[key] = draw(_VALUES)
    return source


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(hf=mutated_configs(), tp=st.sampled_from(["1", "2", "8"]))
@example(hf=edited("Nemotron-H-56B-Base-8K", {"conv_kernel": 1}), tp="2")  # planned, then exit 1 at build
def test_mutated_configs_plan_or_are_refused(hf: dict[str, Any], tp: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert main(["plan", "--model", str(tmp_path), "--gpu", "H100-80GB", "--tp-size", tp]) in (0, 2, 3)
    assert "Traceback" not in capsys.readouterr().err
