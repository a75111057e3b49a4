"""Parameter shapes from HF configs: public totals, tensor/pipeline sharding, NEXTN layers, quantized marks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.weights import ParamSpec, count_parameters, parameter_specs

PRESETS = Path(__file__).resolve().parents[1] / "kvcache" / "models" / "presets"
CORPUS = Path(__file__).resolve().parent / "model_corpus"

# Mixtral-8x7B is not shipped as a preset; these are its published config.json values.
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 1e6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def preset(name: str) -> dict[str, Any]:
    """A shipped HF config (stdlib json reads Nemotron-H's `Infinity`)."""
    return json.loads((PRESETS / f"{name}.json").read_text())


def by_name(specs: tuple[ParamSpec, ...]) -> dict[str, ParamSpec]:
    return {s.name: s for s in specs}


# Published totals. Qwen3-Next: the card says 80B; HF's 81.3B counts its MTP module too.
# Nemotron-H-56B: the card's "56B" is rounded; our 56.32e9 includes every Mamba-2 norm and conv bias.
@pytest.mark.parametrize(("name", "published", "tolerance"), [
    ("Llama-3.1-8B-Instruct", 8.03e9, 0.01),
    ("Qwen3-8B", 8.19e9, 0.01),
    ("Llama-2-7b-hf", 6.74e9, 0.01),
    ("DeepSeek-V3", 671e9, 0.01),
    ("DeepSeek-V2-Lite", 15.7e9, 0.01),
    ("Qwen2.5-7B-Instruct", 7.62e9, 0.01),
    ("gemma-2-9b-it", 9.24e9, 0.01),
    ("gpt-oss-20b", 20.9e9, 0.01),
    ("Mistral-7B-v0.1", 7.24e9, 0.01),
    ("Llama-3.2-1B-Instruct", 1.24e9, 0.01),
    ("Qwen3-Next-80B-A3B-Thinking", 80e9, 0.02),
    ("Nemotron-H-56B-Base-8K", 56e9, 0.03),
])
def test_total_matches_published_figure(name: str, published: float, tolerance: float) -> None:
    assert count_parameters(preset(name)) == pytest.approx(published, rel=tolerance)


def test_mixtral_8x7b_total() -> None:
    assert count_parameters(MIXTRAL_8X7B) == pytest.approx(46.7e9, rel=0.01)


def test_smollm2_135m_is_exact() -> None:
    assert count_parameters(preset("SmolLM2-135M")) == 134_515_008


def test_tied_embedding_counts_once_unless_the_stage_lacks_it() -> None:
    cfg = preset("SmolLM2-135M")
    names = by_name(parameter_specs(cfg))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    last_stage = by_name(parameter_specs(cfg, include_embedding=False))
    assert last_stage["lm_head.weight"].shape == (49152, 576)


@pytest.mark.parametrize(("name", "layers"), [("GLM-4-9B-0414", 40), ("Seed-OSS-36B-Instruct", 64)])
def test_attention_bias_gives_q_k_v_a_bias_but_not_o_proj_where_the_family_says_so(name: str, layers: int) -> None:
    """GLM-4-0414 biases q/k/v only; Seed-OSS says attention_out_bias false. Llama's attention_bias covers o_proj."""
    config = json.loads((CORPUS / f"{name}.json").read_text())
    names = by_name(parameter_specs(config))
    assert "model.layers.0.self_attn.q_proj.bias" in names and "model.layers.0.self_attn.o_proj.bias" not in names
    llama = {**preset("Llama-3.1-8B-Instruct"), "attention_bias": True}
    assert "model.layers.0.self_attn.o_proj.bias" in by_name(parameter_specs(llama))
    biases = [n for n in names if n.endswith("_proj.bias")]
    assert len(biases) == 3 * layers  # q, k, v in every layer; o_proj's nowhere


def test_gemma2_ties_by_default_and_has_four_norms() -> None:
    names = by_name(parameter_specs(preset("gemma-2-9b-it")))
    assert "lm_head.weight" not in names
    assert sum(n.startswith("model.layers.0.") and n.endswith("layernorm.weight") for n in names) == 4


@pytest.mark.parametrize(("tp", "shape"), [(1, (1024, 4096)), (2, (512, 4096)), (8, (128, 4096)), (16, (128, 4096))])
def test_llama_k_proj_per_rank(tp: int, shape: tuple[int, int]) -> None:
    names = by_name(parameter_specs(preset("Llama-3.1-8B-Instruct"), tp_size=tp))
    assert names["model.layers.0.self_attn.k_proj.weight"].shape == shape


def test_tensor_parallel_shards_sum_to_the_model() -> None:
    cfg = preset("Llama-3.1-8B-Instruct")
    replicated_norms = (2 * 32 + 1) * 4096
    assert 8 * count_parameters(cfg, tp_size=8) - 7 * replicated_norms == count_parameters(cfg)


def test_tensor_parallel_shapes() -> None:
    names = by_name(parameter_specs(preset("Llama-3.1-8B-Instruct"), tp_size=7))
    assert names["model.embed_tokens.weight"].shape == (18323, 4096)  # ceil(128256 / 7)
    assert names["model.layers.0.self_attn.o_proj.weight"].shape == (4096, 5 * 128)  # ceil(32 / 7) heads
    assert names["model.layers.0.mlp.down_proj.weight"].shape == (4096, 2048)
    assert names["model.layers.0.input_layernorm.weight"].shape == (4096,)


def test_moe_tensor_parallel_splits_expert_intermediate() -> None:
    names = by_name(parameter_specs(preset("DeepSeek-V3"), tp_size=8))
    assert names["model.layers.3.mlp.experts.gate_up_proj"].shape == (256, 2 * 256, 7168)
    assert names["model.layers.3.mlp.experts.down_proj"].shape == (256, 7168, 256)
    assert names["model.layers.3.mlp.gate.weight"].shape == (256, 7168)
    assert names["model.layers.0.self_attn.q_a_proj.weight"].shape == (1536, 7168)
    assert names["model.layers.0.self_attn.kv_b_proj.weight"].shape == (16 * 256, 512)


def test_pipeline_stages_split_the_layers() -> None:
    cfg = preset("Llama-3.1-8B-Instruct")
    first = parameter_specs(cfg, layer_start=0, layer_end=16, include_lm_head=False)
    last = parameter_specs(cfg, layer_start=16, layer_end=32, include_embedding=False)
    assert sum(s.numel for s in first + last) == count_parameters(cfg)
    assert {s.name for s in first}.isdisjoint(s.name for s in last)
    assert "model.layers.15.mlp.down_proj.weight" in by_name(first)
    assert "model.layers.16.mlp.down_proj.weight" in by_name(last)
    assert "lm_head.weight" in by_name(last) and "model.norm.weight" in by_name(last)


def test_layer_range_outside_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the model's 32 layers"):
        parameter_specs(preset("Llama-3.1-8B-Instruct"), layer_start=10, layer_end=40)


def test_deepseek_v3_nextn_layer() -> None:
    cfg = preset("DeepSeek-V3")
    specs = parameter_specs(cfg, nextn=True)
    names = by_name(specs)
    assert 11e9 < count_parameters(cfg, nextn=True) < 15e9
    assert names["model.layers.61.eh_proj.weight"].shape == (7168, 2 * 7168)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        assert names[f"model.layers.61.{norm}.weight"].shape == (7168,)
    assert names["model.layers.61.mlp.experts.gate_up_proj"].shape == (256, 4096, 7168)  # MoE like layer 60
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)


def test_nextn_without_nextn_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="num_nextn_predict_layers"):
        parameter_specs(preset("Llama-3.1-8B-Instruct"), nextn=True)


def test_deepseek_dense_then_moe_layers() -> None:
    names = by_name(parameter_specs(preset("DeepSeek-V3")))
    assert names["model.layers.2.mlp.gate_proj.weight"].shape == (18432, 7168)
    assert "model.layers.3.mlp.gate_proj.weight" not in names
    assert names["model.layers.3.mlp.shared_experts.gate_proj.weight"].shape == (2048, 7168)
    assert names["model.layers.3.mlp.gate.e_score_correction_bias"].shape == (256,)
    assert names["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape == (576, 7168)
    assert names["model.layers.0.self_attn.o_proj.weight"].shape == (7168, 128 * 128)


def test_deepseek_v2_lite_plain_q_proj_and_no_score_bias() -> None:
    names = by_name(parameter_specs(preset("DeepSeek-V2-Lite")))
    assert names["model.layers.0.self_attn.q_proj.weight"].shape == (16 * 192, 2048)
    assert "model.layers.0.self_attn.q_a_proj.weight" not in names
    assert not any("e_score_correction_bias" in n for n in names)
    assert names["model.layers.1.mlp.shared_experts.up_proj.weight"].shape == (2 * 1408, 2048)


def test_qwen_biases_and_norms() -> None:
    qwen2 = by_name(parameter_specs(preset("Qwen2.5-7B-Instruct")))
    assert qwen2["model.layers.0.self_attn.k_proj.bias"].shape == (512,)
    assert "model.layers.0.self_attn.o_proj.bias" not in qwen2
    qwen3 = by_name(parameter_specs(preset("Qwen3-8B")))
    assert qwen3["model.layers.0.self_attn.q_norm.weight"].shape == (128,)
    assert "model.layers.0.self_attn.q_proj.bias" not in qwen3


def test_gpt_oss_layer() -> None:
    names = by_name(parameter_specs(preset("gpt-oss-20b")))
    p = "model.layers.0."
    assert names[f"{p}self_attn.sinks"].shape == (64,)
    assert names[f"{p}self_attn.o_proj.bias"].shape == (2880,)
    assert names[f"{p}mlp.router.bias"].shape == (32,)
    assert names[f"{p}mlp.experts.gate_up_proj_bias"].shape == (32, 5760)
    assert names[f"{p}mlp.experts.down_proj"].shape == (32, 2880, 2880)


def test_qwen3_next_layer_kinds() -> None:
    names = by_name(parameter_specs(preset("Qwen3-Next-80B-A3B-Thinking")))
    assert names["model.layers.3.self_attn.q_proj.weight"].shape == (2 * 16 * 256, 2048)  # output gate doubles q
    assert "model.layers.3.linear_attn.conv1d.weight" not in names
    assert names["model.layers.0.linear_attn.conv1d.weight"].shape == (2 * 16 * 128 + 32 * 128, 1, 4)
    assert names["model.layers.0.linear_attn.in_proj_qkvz.weight"].shape == (12288, 2048)
    assert names["model.layers.0.linear_attn.in_proj_ba.weight"].shape == (64, 2048)
    assert names["model.layers.0.mlp.shared_expert_gate.weight"].shape == (1, 2048)
    assert sum(n.endswith("self_attn.q_proj.weight") for n in names) == 12


def test_nemotron_h_layer_kinds() -> None:
    cfg = preset("Nemotron-H-56B-Base-8K")
    names = by_name(parameter_specs(cfg))
    pattern = cfg["hybrid_override_pattern"]
    attention = pattern.index("*")
    assert pattern[:2] == "M-" and attention == 7
    assert names["backbone.layers.0.mixer.in_proj.weight"].shape == (2 * 16384 + 2 * 8 * 256 + 256, 8192)
    assert names["backbone.layers.0.mixer.conv1d.weight"].shape == (16384 + 2 * 8 * 256, 1, 4)
    assert names["backbone.layers.1.mixer.up_proj.weight"].shape == (32768, 8192)
    assert "backbone.layers.1.mixer.gate_proj.weight" not in names
    assert names[f"backbone.layers.{attention}.mixer.k_proj.weight"].shape == (1024, 8192)
    assert sum(n.endswith(".norm.weight") and n.count(".") == 4 for n in names) == len(pattern)


def test_eagle3_draft_head() -> None:
    cfg = preset("EAGLE3-LLaMA3.1-Instruct-8B")
    names = by_name(parameter_specs(cfg))
    assert names["midlayer.self_attn.q_proj.weight"].shape == (4096, 2 * 4096)
    assert names["fc.weight"].shape == (4096, 3 * 4096)
    assert names["lm_head.weight"].shape == (32000, 4096)
    assert names["embed_tokens.weight"].shape == (128256, 4096)
    shared = count_parameters(cfg, include_embedding=False)
    assert count_parameters(cfg) - shared == 128256 * 4096


def test_unknown_architecture_names_itself_and_the_supported() -> None:
    with pytest.raises(ValueError, match=r"'FooModel' is not a decoder-only language model"):
        parameter_specs({"architectures": ["FooModel"], "model_type": "foo"})


def test_missing_field_is_named() -> None:
    cfg = preset("Llama-3.1-8B-Instruct")
    del cfg["intermediate_size"]
    with pytest.raises(ValueError, match="'intermediate_size'"):
        parameter_specs(cfg)


def test_quantized_marks_follow_the_quantization_config() -> None:
    unquantized = parameter_specs(preset("Llama-3.1-8B-Instruct"))
    assert not any(s.quantized for s in unquantized)
    dsv3 = by_name(parameter_specs(preset("DeepSeek-V3")) + parameter_specs(preset("DeepSeek-V3"), nextn=True))
    assert dsv3["model.layers.3.mlp.experts.gate_up_proj"].quantized
    assert dsv3["model.layers.0.self_attn.kv_b_proj.weight"].quantized
    for name in ("model.layers.3.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                 "model.layers.61.eh_proj.weight", "model.layers.0.input_layernorm.weight"):
        assert not dsv3[name].quantized, name
    oss = parameter_specs(preset("gpt-oss-20b"))
    quantized = {s.name.split(".", 3)[3] for s in oss if s.quantized}
    assert quantized == {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}
