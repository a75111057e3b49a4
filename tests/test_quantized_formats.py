"""Quantized checkpoints are sized in their stored format, or refused in one line; never counted at bf16.

Kimi-K2.5 (compressed-tensors, pack-quantized int4, groups of 32, symmetric; attention, shared experts,
the dense MLP and lm_head ignored) at TP 8, by hand from its config.json (hidden 7168, 61 layers, the
first dense, 384 routed experts of 2048, one shared, q_lora 1536, kv_lora 512, 64 heads of 128 + 64
rope and 128 v, vocab 163,840), as SGLang 0.5.23's WNA16 MoE scheme holds it:

  routed experts per MoE layer, intermediate 2048 / 8 = 256 per rank:
    gate_up  packed int32 384 x 512 x (7168 x 4 / 32) x 4 B = 704,643,072   scales bf16 384 x 512 x 224 x 2 = 88,080,384
    down     packed int32 384 x 7168 x (256 x 4 / 32) x 4 B = 352,321,536   scales bf16 384 x 7168 x 8 x 2  = 44,040,192
    = 1,189,085,184 B, x 60 MoE layers = 71,345,111,040 B
  bf16 parameters (x 2 B):
    embedding + lm_head 2 x 20,480 x 7168 + final norm 7168                       = 293,608,448
    per layer: MLA (q_a 1536x7168, q_a norm 1536, q_b 1536x1536, kv_a 576x7168, kv_a norm 512,
      kv_b 2048x512, o 7168x1024) 25,888,768 + two norms 14,336, x 61                = 1,580,089,344
    layer 0 dense MLP 3 x 2304 x 7168                                              = 49,545,216
    per MoE layer: router 384 x 7168 + bias 384 + shared expert 3 x 256 x 7168, x 60 = 495,475,200
    = 2,418,718,208 parameters = 4,837,436,416 B
  total 76,182,547,456 B (70.95 GiB) per rank, where bf16 everywhere gave 240.76 GiB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from app.cli import main
from app.weights import DummyWeightLoader, ParamSpec, parameter_specs, storage_of
from kvcache.inputs.dtypes import BFLOAT16, FLOAT16, INT32
from kvcache.errors import ModelConfigFieldError
from kvcache.models.model_config import ModelConfig
from kvcache.models.quantization import PackedIntWeights, Quantization
from kvcache.models.hf_config import model_config_from_hf

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "model_corpus"
SHIPPED = sorted([*CORPUS.glob("*.json"), *(ROOT / "kvcache" / "models" / "presets").glob("*.json")])
META = torch.device("meta")
INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "input_activations": None,
    "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True,
                "dynamic": False, "actorder": None}}}}


def kimi_k25() -> ModelConfig:
    return model_config_from_hf(CORPUS / "Kimi-K2.5.json", name="Kimi-K2.5")


def test_kimi_k25_int4_weights_per_rank_at_tp8_by_hand() -> None:
    model = kimi_k25()
    assert model.weights.quantization.weights == PackedIntWeights(bits=4, group_size=32, symmetric=True)
    loader = DummyWeightLoader(device=META, dtype=BFLOAT16, quantization=model.weights.quantization)
    weights = loader.load(parameter_specs(model, tp_size=8))
    routed = 60 * (384 * 512 * 896 * 4 + 384 * 512 * 224 * 2 + 384 * 7168 * 32 * 4 + 384 * 7168 * 8 * 2)
    plain = 2 * (2 * 20_480 * 7168 + 7168 + 61 * (25_888_768 + 14_336) + 3 * 2304 * 7168
                 + 60 * (384 * 7168 + 384 + 3 * 256 * 7168))
    assert weights.tensor_bytes == routed + plain == 76_182_547_456
    packed = weights.tensors["language_model.model.layers.1.mlp.experts.down_proj_packed"]
    assert packed.dtype == torch.int32 and packed.shape == (384, 7168, 32)
    attention = weights.tensors["language_model.model.layers.1.self_attn.o_proj.weight"]  # ignored: re:.*self_attn.*
    assert attention.dtype == torch.bfloat16 and attention.shape == (7168, 1024)


def test_asymmetric_and_channel_schemes_by_hand() -> None:
    spec = ParamSpec("w.weight", (4, 256, 1000), True)
    asymmetric = Quantization("compressed-tensors", PackedIntWeights(bits=4, group_size=128, symmetric=False))
    assert [(t.name, t.shape, t.dtype) for t in storage_of(spec, FLOAT16, asymmetric)] == [
        ("w.weight_packed", (4, 256, 125), INT32),  # 1000 x 4 bits = 125 int32 per row
        ("w.weight_scale", (4, 256, 8), FLOAT16),  # ceil(1000 / 128) groups
        ("w.weight_zero_point", (4, 32, 8), INT32),  # 256 rows x 4 bits = 32 int32 per group column
    ]
    channel = Quantization("compressed-tensors", PackedIntWeights(bits=8, group_size=None))
    assert [(t.shape, t.dtype) for t in storage_of(spec, BFLOAT16, channel)] == [
        ((4, 256, 250), INT32), ((4, 256, 1), BFLOAT16)]


def _with_quantization(quantization: dict[str, Any]) -> dict[str, Any]:
    config = json.loads((ROOT / "kvcache" / "models" / "presets" / "SmolLM2-135M.json").read_text())
    return config | {"quantization_config": quantization}


def _group(**weights: Any) -> dict[str, Any]:
    group = INT4["config_groups"]["group_0"]
    return INT4 | {"config_groups": {"group_0": group | {"weights": group["weights"] | weights}}}


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"quant_method": "awq", "bits": 4}, "'quantization_config.quant_method' is 'awq'; expected one of the weight "
                                             "formats sized here ('fp8', 'mxfp4', 'compressed-tensors')"),
        ({"quant_method": "gptq", "bits": 4}, "'quantization_config.quant_method' is 'gptq'"),
        ({"load_in_4bit": True}, "'quantization_config.quant_method' is None"),
        (INT4 | {"format": "float-quantized"}, "'quantization_config.format' is 'float-quantized'; expected 'pack-quantized'"),
        (INT4 | {"config_groups": {"a": INT4["config_groups"]["group_0"], "b": INT4["config_groups"]["group_0"]}},
         "'quantization_config.config_groups' is '2 groups'; expected one config group"),
        (_group(type="float"), "'quantization_config.config_groups.group_0.weights.type' is 'float'; expected 'int'"),
        (_group(num_bits=2), "'quantization_config.config_groups.group_0.weights.num_bits' is 2; expected 4 or 8"),
        (_group(strategy="tensor"), "weights.strategy' is 'tensor'; expected 'group' or 'channel'"),
        (_group(actorder="group"), "weights.actorder' is 'group'"),
        (INT4 | {"config_groups": {"group_0": INT4["config_groups"]["group_0"] | {"input_activations": {"num_bits": 8}}}},
         "group_0.input_activations' is {'num_bits': 8}; expected null (weight-only int quantization)"),
    ],
)
def test_an_unmodelled_weight_format_is_refused_in_one_line(quantization: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigFieldError) as caught:
        model_config_from_hf(_with_quantization(quantization), name="q")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_cli_refuses_an_unmodelled_format_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_with_quantization({"quant_method": "bitsandbytes", "load_in_4bit": True})))
    assert main(["plan", "--model", str(path), "--gpu-memory", "80GiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'quantization_config.quant_method' is 'bitsandbytes'" in err


QUANTIZED = [p for p in SHIPPED if "quantization_config" in p.read_text() and p.stem != "DeepSeek-V4-Flash"]


@pytest.mark.parametrize("path", QUANTIZED, ids=lambda p: p.stem)
def test_every_shipped_quantized_config_is_sized_in_its_format(path: Path) -> None:
    """DeepSeek-V3/V3.2, Kimi-K2 and MiniMax-M2.5 (fp8 blocks), gpt-oss (mxfp4), Kimi-K2.5 (int4); DeepSeek-V4's
    cache is refused before its weights matter."""
    assert model_config_from_hf(path).weights.quantization.weights is not None


def test_a_model_directory_quantized_by_hf_quant_config_is_refused_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ModelOpt checkpoints (NVIDIA's -FP8/-FP4 releases) describe their format in hf_quant_config.json beside a
    config.json without quantization_config: read alone, their weights were counted at bf16 without a word."""
    (tmp_path / "config.json").write_text((ROOT / "kvcache" / "models" / "presets" / "SmolLM2-135M.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}))
    assert main(["plan", "--model", str(tmp_path), "--gpu-memory", "80GiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hf_quant_config.json" in err and "'FP8'" in err


def test_packed_int_weights_load_on_the_cpu() -> None:
    """The int32 packed weights and zero points get random bits like the uint8 formats: filling them with
    uniform floats raised (an internal error, exit 1, for `bootstrap --device cpu` of an int4 checkpoint)."""
    model = model_config_from_hf(_with_quantization(_group(symmetric=False)), name="int4")
    loader = DummyWeightLoader(device=torch.device("cpu"), dtype=BFLOAT16, quantization=model.weights.quantization)
    weights = loader.load(parameter_specs(model, tp_size=1))
    packed = weights.tensors["model.layers.0.mlp.down_proj.weight_packed"]
    zero_points = weights.tensors["model.layers.0.mlp.down_proj.weight_zero_point"]
    assert packed.dtype == zero_points.dtype == torch.int32
    assert packed.unique().numel() > 1 and zero_points.unique().numel() > 1  # noise, not one repeated value


def test_the_reference_decode_refuses_packed_int_weights_in_one_line() -> None:
    """It refused fp8 / mxfp4 bytes but took int32 packed weights, then failed on a missing '.weight' (KeyError)."""
    from app.forward import build_decoder
    from kvcache.errors import UnsupportedModelError

    model = model_config_from_hf(_with_quantization(INT4), name="int4")
    loader = DummyWeightLoader(device=META, dtype=BFLOAT16, quantization=model.weights.quantization)
    weights = loader.load(parameter_specs(model, tp_size=1))
    with pytest.raises(UnsupportedModelError, match="runs unquantized weights; .*_packed is stored as torch.int32"):
        build_decoder(model_config=model, weights=dict(weights.tensors), attention=None)
