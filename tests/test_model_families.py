"""Families with layer kinds of their own: where their layers sit, the pools they land in, their tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from app.weights import parameter_specs
from kvcache.inputs.dtypes import BFLOAT16, KV_CACHE_DTYPES
from kvcache.sizing.layer_specs import MLASpec
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.pool_layout import worker_cache_layout
from kvcache.pools import MLATokenToKVPool
from kvcache.testing.pool_plans import standalone_kv_pool
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).with_name("model_corpus")


def corpus(name: str) -> ModelConfig:
    return model_config_from_hf(CORPUS / f"{name}.json", name=name)


def layout(m: ModelConfig):  # type: ignore[no-untyped-def]
    return worker_cache_layout(model_config=m, parallel_state=ParallelState(), kv_cache_dtype=KV_CACHE_DTYPES["bfloat16"],
                               model_dtype=BFLOAT16)


def test_llama4_nope_layers_are_global_and_the_rest_chunked() -> None:
    m = corpus("Llama-4-Scout-17B-16E-Instruct")
    assert [i for i, k in enumerate(m.layer_kinds) if k == "full_attention"] == list(range(3, 48, 4))
    groups = {g.name: g for g in layout(m).kv_groups}
    # chunked layers keep at most one chunk: a sliding pool of attention_chunk_size tokens beside the full one
    assert groups["swa"].spec.window == 8192 and groups["swa"].paired_with_full and len(groups["swa"].layer_ids) == 36
    names = {s.name for s in parameter_specs(m, layer_end=1, include_lm_head=False)}
    assert "language_model.model.layers.0.mlp.shared_expert.down_proj.weight" in names  # wrapped under language_model


def test_dsa_indexer_buffer_is_allocated_beside_the_latent() -> None:
    spec = next(g.spec for g in layout(corpus("DeepSeek-V3.2")).kv_groups if g.name == "mla")
    assert isinstance(spec, MLASpec) and spec.index_bytes_per_token == 128 + 128 // 128 * 4
    pool = standalone_kv_pool(spec, tokens=64, page_size=64, layer_ids=[0, 1])
    assert isinstance(pool, MLATokenToKVPool) and (pool.kv_lora_rank, pool.qk_rope_head_dim) == (512, 64)
    index = pool.get_index_k_with_scale_buffer(1)
    assert index.shape == (128, 132) and index.dtype == torch.uint8
    assert pool.nbytes == 2 * 128 * spec.bytes_per_token  # rows = size + one padding page


def test_a_parallel_hybrid_layer_caches_kv_and_state() -> None:
    groups = layout(corpus("Falcon-H1-0.5B-Base"))
    assert groups.kv_groups[0].layer_ids == groups.state.layer_ids == tuple(range(36))


def test_nemotron3_moe_layers_have_experts_and_no_cache() -> None:
    m = corpus("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert m.layer_kinds[1] == "mlp" and m.hf_config["hybrid_override_pattern"][1] == "E"
    names = {s.name: s.shape for s in parameter_specs(m, layer_start=1, layer_end=2, include_embedding=False,
                                                       include_lm_head=False)}
    assert names["backbone.layers.1.mixer.experts.up_proj"] == (128, 1856, 2688)  # squared ReLU: no gate
    assert names["backbone.layers.1.mixer.shared_experts.up_proj.weight"] == (3712, 2688)


def test_vision_towers_are_counted_when_their_shapes_are_given() -> None:
    qwen2_vl = corpus("Qwen2-VL-7B-Instruct")
    assert qwen2_vl.vision_weights == "counted"
    tower = sum(s.numel for s in parameter_specs(qwen2_vl) if s.name.startswith("vision_tower."))
    assert 0.6e9 < tower < 0.7e9  # 32 layers of width 1,280 (embed_dim; its hidden_size is the projector's output)
    assert corpus("Kimi-K2.5").vision_weights == "not_counted"  # its vision_config names no ViT shapes we know
    assert corpus("Meta-Llama-3.1-70B").vision_weights == "none"
