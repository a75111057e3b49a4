"""The dummy loader: exact bytes, narrow storage for quantized checkpoints, meta dry runs, clean failure."""

from __future__ import annotations

import dataclasses
import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcache.inputs.dtypes import BFLOAT16, FLOAT16, FLOAT32, UINT8
from kvcache.byte_units import MiB

import app.weights.loader as loader_module
from app.weights import (
    DummyWeightLoader,
    ParamSpec,
    WeightsDoNotFitError,
    bytes_needed,
    parameter_specs,
    storage_of,
)
from kvcache.models.quantization import Fp8Weights, Mxfp4Weights, Quantization
from kvcache.models.hf_config import model_config_from_hf

PRESETS = Path(__file__).resolve().parents[1] / "kvcache" / "models" / "presets"
CPU, META = torch.device("cpu"), torch.device("meta")


def preset(name: str) -> dict[str, Any]:
    return json.loads((PRESETS / f"{name}.json").read_text())


def test_cpu_load_of_smollm2_has_exact_bytes() -> None:
    specs = parameter_specs(preset("SmolLM2-135M"))
    weights = DummyWeightLoader(device=CPU, dtype=BFLOAT16).load(specs)
    assert weights.tensor_bytes == 134_515_008 * 2
    # one allocation: every tensor 512-byte aligned (the 576-value norms take 1,536 B), rounded up to 2 MiB
    assert weights.total_bytes == 129 * 2 * MiB == bytes_needed(specs, BFLOAT16)
    assert len({t.untyped_storage().data_ptr() for t in weights.tensors.values()}) == 1
    assert weights.parameter_count == 134_515_008
    q = weights.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.device == CPU and q.dtype == torch.bfloat16 and q.shape == (576, 576)
    values = weights.tensors["model.embed_tokens.weight"].float()
    assert torch.isfinite(values).all() and values.abs().max() <= 1e-3 and values.std() > 0


def test_loaded_weights_are_read_only() -> None:
    weights = DummyWeightLoader(device=CPU, dtype=FLOAT32).load([ParamSpec("w", (4, 4), False)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        weights.total_bytes = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        weights.tensors["x"] = torch.empty(1)  # type: ignore[index]


def test_meta_load_of_deepseek_v3_fp8_allocates_nothing() -> None:
    model = model_config_from_hf(preset("DeepSeek-V3"))
    specs = parameter_specs(model)
    quantization = model.weights.quantization
    assert quantization.weights == Fp8Weights((128, 128))
    loader = DummyWeightLoader(device=META, dtype=BFLOAT16, quantization=quantization)
    weights = loader.load(specs)
    assert weights.total_bytes == bytes_needed(specs, BFLOAT16, quantization) == loader.bytes_needed(specs)
    assert all(t.is_meta for t in weights.tensors.values())
    experts = weights.tensors["model.layers.3.mlp.experts.gate_up_proj"]
    assert experts.dtype == torch.uint8 and experts.shape == (256, 4096, 7168)
    scales = weights.tensors["model.layers.3.mlp.experts.gate_up_proj_scale_inv"]
    assert scales.dtype == torch.float32 and scales.shape == (256, 32, 56)
    assert weights.tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    # ~1 byte per quantized parameter: 673.2 GB, against 1342 GB in bf16.
    assert weights.total_bytes == pytest.approx(673.15e9, rel=0.001)


def test_gpt_oss_mxfp4_experts_are_about_the_checkpoint_size() -> None:
    # The published checkpoint is ~13.8 GB: experts in MXFP4 (4.25 bits an element with
    # their scales), everything else in bf16. We compute 13.76 GB.
    model = model_config_from_hf(preset("gpt-oss-20b"))
    specs = parameter_specs(model)
    quantization = model.weights.quantization
    assert quantization.weights == Mxfp4Weights()
    weights = DummyWeightLoader(device=META, dtype=BFLOAT16, quantization=quantization).load(specs)
    assert weights.total_bytes == bytes_needed(specs, BFLOAT16, quantization)
    assert weights.total_bytes == pytest.approx(13.8e9, rel=0.10)
    blocks = weights.tensors["model.layers.0.mlp.experts.down_proj"]
    assert blocks.dtype == torch.uint8 and blocks.shape == (32, 2880, 1440)
    assert weights.tensors["model.layers.0.mlp.experts.down_proj_scales"].shape == (32, 2880, 90)
    assert weights.tensors["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert weights.tensors["model.layers.0.mlp.router.weight"].dtype == torch.bfloat16


def test_fp8_on_cpu_stores_random_bytes_and_block_scales() -> None:
    specs = [ParamSpec("w", (300, 260), True), ParamSpec("n", (260,), False)]
    fp8 = Quantization(method="fp8", weights=Fp8Weights((128, 128)))
    weights = DummyWeightLoader(device=CPU, dtype=BFLOAT16, quantization=fp8).load(specs)
    w = weights.tensors["w"]
    assert w.dtype == torch.uint8 and w.unique().numel() > 200
    assert weights.tensors["w_scale_inv"].shape == (3, 3)
    assert weights.tensor_bytes == 300 * 260 + 9 * 4 + 260 * 2
    assert weights.total_bytes == 10 * MiB == bytes_needed(specs, BFLOAT16, fp8)  # the smallest arena


def test_fp8_per_tensor_scale_without_blocks() -> None:
    stored = storage_of(ParamSpec("e", (8, 64, 32), True), BFLOAT16, Quantization("fp8", Fp8Weights(None)))
    assert [(t.name, t.shape, t.dtype) for t in stored] == [("e", (8, 64, 32), UINT8),
                                                            ("e_scale_inv", (8,), FLOAT32)]


def test_quantized_storage_only_applies_to_quantized_specs() -> None:
    stored = storage_of(ParamSpec("norm.weight", (64,), False), FLOAT16, Quantization("mxfp4", Mxfp4Weights()))
    assert [(t.shape, t.dtype) for t in stored] == [((64,), FLOAT16)]


@pytest.mark.parametrize(("model", "quantization", "expected"), [
    ("SmolLM2-135M", {"quant_method": "fp8", "weight_block_size": [128, 128]}, Fp8Weights((128, 128))),
    ("SmolLM2-135M", {"quant_method": "fp8"}, Fp8Weights(None)),
    ("DeepSeek-V2-Lite", {"quant_method": "mxfp4"}, Mxfp4Weights()),  # experts only: a dense model's is refused
    ("SmolLM2-135M", None, None),
])
def test_the_model_description_names_the_weight_format(model: str, quantization: dict[str, Any] | None,
                                                       expected: Any) -> None:
    cfg = preset(model) | ({} if quantization is None else {"quantization_config": quantization})
    assert model_config_from_hf(cfg).weights.quantization.weights == expected


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 270532608 bytes. Error code 12 (Cannot allocate memory)"),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
])
def test_a_failed_allocation_leaves_nothing(monkeypatch: pytest.MonkeyPatch, error: RuntimeError) -> None:
    specs = parameter_specs(preset("SmolLM2-135M"))
    asked: list[int] = []

    def fail(nbytes: int, device: torch.device) -> None:
        asked.append(nbytes)
        raise error

    monkeypatch.setattr(loader_module, "_arena", fail)
    with pytest.raises(WeightsDoNotFitError) as caught:
        DummyWeightLoader(device=CPU, dtype=BFLOAT16).load(specs)
    failure = caught.value
    assert asked == [failure.needed_bytes] == [bytes_needed(specs, BFLOAT16)]  # one allocation, all or nothing
    assert failure.allocated_bytes == 0
    assert "0.25 GiB" in str(failure) and "--tp-size" in str(failure)
    assert failure.__cause__ is error


def test_a_runtime_error_that_is_not_out_of_memory_is_not_called_weights_do_not_fit(mocker: Any) -> None:
    """Any RuntimeError used to read as 'the weights do not fit' (exit 3); a bug must surface as itself."""
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    mocker.patch.object(loader_module, "_arena", side_effect=error)
    with pytest.raises(RuntimeError) as caught:
        DummyWeightLoader(device=CPU, dtype=BFLOAT16).load(parameter_specs(preset("SmolLM2-135M")))
    assert caught.value is error



def test_the_runner_sizes_fp8_scales_by_the_checkpoint_block_size(make_engine) -> None:  # type: ignore[no-untyped-def]
    """The runner reads quantization_config.weight_block_size instead of assuming 128 x 128 blocks
    (it used to, whatever the checkpoint said): the tiny model's 64 x 128 weights in 32 x 32 blocks
    carry 2 x 4 float32 scales each, not 1."""
    from app.weights import DummyWeightLoader
    from kvcache.inputs.cards import card_named
    from kvcache.testing.fakes import TINY_MODEL_HF_CONFIG

    fp8 = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    model = model_config_from_hf({**TINY_MODEL_HF_CONFIG, "quantization_config": fp8})
    runner = make_engine(model=model, device="meta", card=card_named("H100-80GB")).engine().target
    runner.load_weights()

    def stored(block: tuple[int, int]) -> int:
        loader = DummyWeightLoader(device=torch.device("meta"), dtype=runner.model_dtype,
                                   quantization=Quantization("fp8", Fp8Weights(block)))
        return loader.load(runner.weight_specs()).tensor_bytes

    assert runner.weights is not None and runner.weights.tensor_bytes == stored((32, 32)) != stored((128, 128))


def test_the_runner_takes_the_weight_format_from_the_model_description_alone(make_engine) -> None:  # type: ignore[no-untyped-def]
    """One home for quant_method / weight_block_size: the description read from config.json. A ModelConfig
    whose raw dict is gone still loads fp8 weights (the runner re-read hf_config and loaded bf16)."""
    import msgspec

    from kvcache.inputs.cards import card_named
    from kvcache.testing.fakes import TINY_MODEL_HF_CONFIG

    fp8 = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    model = model_config_from_hf({**TINY_MODEL_HF_CONFIG, "quantization_config": fp8})
    runner = make_engine(model=msgspec.structs.replace(model, hf_config={}), device="meta",
                         card=card_named("H100-80GB")).engine().target
    runner.load_weights()
    quantization = Quantization("fp8", Fp8Weights((32, 32)))
    expected = DummyWeightLoader(device=META, dtype=runner.model_dtype, quantization=quantization)
    assert runner.weights is not None
    assert runner.weights.tensor_bytes == expected.load(runner.weight_specs()).tensor_bytes
    assert runner.weights.tensor_bytes < DummyWeightLoader(device=META, dtype=runner.model_dtype).load(
        runner.weight_specs()).tensor_bytes
