"""MTP (NEXTN) layers of Qwen3-Next, Qwen3.5, MiMo and Nemotron-3 are counted where SGLang 0.5.23 loads them.

SGLang's target models skip the checkpoint's `mtp` tensors; a NEXTN draft (the same checkpoint, its
architecture rewritten to the family's MTP class, one MTP step) loads them and caches its attention
layer. So --speculative-algorithm NEXTN must work for these families, with the draft's weights and KV
as below; before, it was refused ("no next-token-prediction layers") and nothing counted them.
Parameter counts below are worked out by hand from each config's shapes (TP 1 unless said).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.weights import count_parameters, parameter_specs
from kvcache.errors import ConfigError, ModelConfigFieldError
from kvcache.models.presets import load_model_config
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).with_name("model_corpus")


def corpus(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / f"{name}.json").read_text())


def qwen3_next_80b_mtp() -> int:
    """hidden 2048, 16 gated q heads and 2 KV heads of 256, 512 experts of 512, one shared expert of 512."""
    h = 2048
    norms = 5 * h  # pre_fc_norm_embedding, pre_fc_norm_hidden, input/post-attention norms, final norm
    fc = h * 2 * h
    attention = (16 * 256 * 2) * h + 2 * (2 * 256) * h + h * (16 * 256) + 2 * 256  # q (with gate), k, v, o, q/k norms
    moe = 512 * h + 512 * (2 * 512) * h + 512 * h * 512 + 3 * 512 * h + h  # router, experts, shared, shared gate
    return norms + fc + attention + moe


def qwen3_5_27b_mtp() -> int:
    """hidden 5120, 24 gated q heads and 4 KV heads of 256, a dense SwiGLU MLP of 17,408."""
    h = 5120
    attention = (24 * 256 * 2) * h + 2 * (4 * 256) * h + h * (24 * 256) + 2 * 256
    return 5 * h + h * 2 * h + attention + 3 * 17_408 * h


def mimo_7b_mtp() -> int:
    """hidden 4096, 32 q heads and 8 KV heads of 128 (q/k/v biased, o not, as Qwen2), SwiGLU MLP of 11,008."""
    h = 4096
    attention = (h * h + h) + 2 * (1024 * h + 1024) + h * h
    return 5 * h + h * 2 * h + attention + 3 * 11_008 * h  # token/hidden/input/post/final norms, input_proj


def nemotron_3_super_mtp() -> int:
    """Pattern '*E': hidden 4096, 32 q heads and 2 KV heads of 128; 512 squared-ReLU experts of 2,688 in a
    1,024 latent, a shared expert of 5,376, a router with a score-correction bias."""
    h = 4096
    norms = 5 * h  # enorm, hnorm, the two layers' norms, final_layernorm
    eh_proj = h * 2 * h
    attention = 32 * 128 * h + 2 * (2 * 128) * h + h * 32 * 128
    moe = 512 * h + 512 + 2 * 1024 * h + 2 * 512 * 2688 * 1024 + 2 * 5376 * h
    return norms + eh_proj + attention + moe


MTP = [  # (config, MTP parameters by hand, the draft's cache kinds)
    (lambda: load_model_config("Qwen3-Next-80B-A3B-Thinking"), qwen3_next_80b_mtp(), ("full_attention",)),
    (lambda: model_config_from_hf(corpus("Qwen3.5-27B")), qwen3_5_27b_mtp(), ("full_attention",)),
    (lambda: model_config_from_hf(corpus("MiMo-7B-Base")), mimo_7b_mtp(), ("full_attention",)),
    (lambda: model_config_from_hf(corpus("NVIDIA-Nemotron-3-Super-120B-A12B-FP8")), nemotron_3_super_mtp(),
     ("full_attention", "mlp")),
]


@pytest.mark.parametrize(("model", "parameters", "kinds"), MTP, ids=["qwen3-next", "qwen3.5", "mimo", "nemotron-3"])
def test_the_mtp_layers_are_the_nextn_drafts_weights_and_cache(model: Any, parameters: int,
                                                              kinds: tuple[str, ...]) -> None:
    target = model()
    assert count_parameters(target, nextn=True) == parameters
    assert not any("mtp" in spec.name for spec in parameter_specs(target))  # the target skips them, as SGLang
    draft = target.nextn_draft()
    assert draft.layer_kinds == kinds and draft.kv_layer_count == 1 and draft.nextn_of_target


def test_the_published_totals_include_the_mtp_layer() -> None:
    """Qwen3-Next-80B: 79.67 B of decoder and ends plus 1.65 B of MTP; the checkpoint's 81.3 B."""
    model = load_model_config("Qwen3-Next-80B-A3B-Thinking")
    assert count_parameters(model) + count_parameters(model, nextn=True) == pytest.approx(81.3e9, rel=0.005)


def test_nemotron_3_mtp_eh_proj_is_column_parallel_and_named_as_the_checkpoint() -> None:
    model = model_config_from_hf(corpus("NVIDIA-Nemotron-3-Super-120B-A12B-FP8"))
    specs = {s.name: s.shape for s in parameter_specs(model, nextn=True, tp_size=8)}
    assert specs["mtp.layers.0.eh_proj.weight"] == (4096 // 8, 2 * 4096)
    assert "mtp.layers.1.final_layernorm.weight" in specs and "mtp.layers.1.mixer.experts.up_proj" in specs
    ultra = model_config_from_hf(corpus("NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"))  # mtp_layers_block_type
    assert ultra.nextn_layer_kinds == ("full_attention", "mlp")


QWEN3_NEXT_MTP_TP8 = (5 * 2048 + 2048 * 4096 + 512 * 2048 + 2048  # norms, fc (replicated), router, shared gate
                     + 2 * 256 * 2 * 2048 + 2 * 256 * 2048 + 2048 * 512 + 2 * 256  # q: 2 heads, k/v: 1 head, o
                     + 512 * (2 * 64) * 2048 + 512 * 2048 * 64 + 3 * 64 * 2048)  # experts and shared at 512 / 8
MIMO_MTP_TP8 = (5 * 4096 + 4096 * 8192  # norms, input_proj (replicated)
                + (512 * 4096 + 512) + 2 * (128 * 4096 + 128) + 4096 * 512 + 3 * 1376 * 4096)  # 4 q / 1 KV head
NEMOTRON_3_SUPER_MTP_TP8 = (5 * 4096 + 512 * 8192  # norms, eh_proj split 8 ways
                            + 512 * 4096 + 2 * 128 * 4096 + 4096 * 512  # q: 4 heads, k/v: 1 head, o
                            + 512 * 4096 + 512 + 2 * 1024 * 4096  # router, score bias, latent projections
                            + 2 * 512 * 336 * 1024 + 2 * 672 * 4096)  # experts and shared at 2,688 / 8, 5,376 / 8


@pytest.mark.parametrize(("model", "draft_bytes_per_token", "draft_parameters"), [
    # 1 layer x K and V x KV heads per rank x head_dim x 2 B
    ("Qwen3-Next-80B-A3B-Thinking", 1 * 2 * 1 * 256 * 2, QWEN3_NEXT_MTP_TP8),  # 2 KV heads at TP 8: one replicated
    (str(CORPUS / "MiMo-7B-Base.json"), 1 * 2 * 1 * 128 * 2, MIMO_MTP_TP8),  # 8 KV heads at TP 8: one
    (str(CORPUS / "NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json"), 1 * 2 * 1 * 128 * 2,  # the MoE MTP layer caches none
     NEMOTRON_3_SUPER_MTP_TP8),
])
def test_nextn_plans_the_draft_from_the_models_own_mtp_layer(model: str, draft_bytes_per_token: int,
                                                            draft_parameters: int,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", model, "--gpu", "H200", "--tp-size", "8", "--speculative-algorithm", "NEXTN", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    tokens = report["max_total_num_tokens"]
    draft_kv = report["buffers"]["kv_draft_full"]
    assert draft_kv == -(-(tokens + 1) * draft_bytes_per_token // 512) * 512  # tokens + the padding slot, 512-aligned
    assert report["draft"]["parameter_count"] == draft_parameters  # this rank's share of the MTP layer


@pytest.mark.parametrize(("name", "field", "value"), [
    ("MiMo-7B-Base", "num_nextn_predict_layers", 2),  # SGLang's MiMoMTP is one layer
    ("NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "num_nextn_predict_layers", 2),  # SGLang asserts one step
    ("NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "mtp_hybrid_override_pattern", "M*E"),  # no Mamba MTP layer
])
def test_an_mtp_config_sglang_cannot_draft_with_is_refused_naming_the_field(name: str, field: str, value: Any) -> None:
    with pytest.raises(ModelConfigFieldError, match=re.escape(f"'{field}' is {value!r}; expected")):
        model_config_from_hf(corpus(name) | {field: value})


def test_a_qwen3_5_checkpoint_without_mtp_layers_has_no_nextn_draft() -> None:
    model = model_config_from_hf(corpus("Qwen3.5-27B") | {"text_config": corpus("Qwen3.5-27B")["text_config"]
                                                                | {"mtp_num_hidden_layers": 0}})
    with pytest.raises(ConfigError, match="has no next-token-prediction layers"):
        model.nextn_draft()


def test_nextn_for_mtp_layers_no_reader_models_says_so_not_that_there_are_none() -> None:
    """Step-3.7-Flash declares three MTP layers; the message said it had none."""
    with pytest.raises(ConfigError, match=r"declares MTP layers \(num_nextn_predict_layers 3\) that this engine does "
                                          r"not model for Step3p7FlashForCausalLM; .*use EAGLE"):
        model_config_from_hf(corpus("Step-3.7-Flash")).nextn_draft()
