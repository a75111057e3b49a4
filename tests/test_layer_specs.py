"""Layer specs: a rank's cache bytes per token (and per request, for recurrent state), by hand.

Every number below is worked out from the model's published config.json (kvcache/models/presets/):
bytes per token = sum over this rank's KV layers of K + V elements x element bytes
(MLA: one latent of kv_lora_rank + qk_rope_head_dim); state bytes per request = sum over
state layers of conv window (model dtype) + SSM state (--mamba-ssm-dtype, float32 by default).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from kvcache.inputs.dtypes import BFLOAT16, FLOAT32, KV_CACHE_DTYPES, DType, KVCacheDtype, resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.errors import ConfigError
from kvcache.sizing.layer_specs import (
    FullAttentionSpec, LayerPlacement, MLASpec, RecurrentStateSpec, SlidingWindowSpec, model_layer_specs,
)
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.models.presets import load_model_config
from kvcache.testing import tiny_model_config


def specs(name: str | ModelConfig, kv: str = "auto", *, parallel: ParallelState | None = None,
          ssm_dtype: DType = FLOAT32) -> tuple[LayerPlacement, ...]:
    model = load_model_config(name) if isinstance(name, str) else name
    model_dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    return model_layer_specs(model, parallel or ParallelState(), resolve_kv_cache_dtype(kv, model_dtype),
                             model_dtype=model_dtype, ssm_dtype=ssm_dtype)


def token_bytes(placements: tuple[LayerPlacement, ...]) -> int:
    return sum(p.spec.bytes_per_token for p in placements if not isinstance(p.spec, RecurrentStateSpec))


def state_bytes(placements: tuple[LayerPlacement, ...]) -> int:
    return sum(p.spec.bytes_per_request for p in placements if isinstance(p.spec, RecurrentStateSpec))


@pytest.mark.parametrize(
    ("model", "kv", "tp", "expected"),
    [
        # 32 layers x 8 KV heads x (128 K + 128 V) x 2 bytes
        ("Llama-3.1-8B-Instruct", "auto", 1, 32 * 8 * (128 + 128) * 2),  # 131,072
        ("Llama-3.1-8B-Instruct", "bfloat16", 1, 131_072),
        ("Llama-3.1-8B-Instruct", "float32", 1, 32 * 8 * 256 * 4),  # 262,144
        ("Llama-3.1-8B-Instruct", "fp8_e4m3", 1, 32 * 8 * 256 * 1),  # 65,536
        ("Llama-3.1-8B-Instruct", "fp8_e5m2", 1, 65_536),
        # FP4: half a byte per value plus one scale byte per 16 values: 32 x 8 x 256 x (1/2 + 1/16)
        ("Llama-3.1-8B-Instruct", "fp4_e2m1", 1, 32 * (8 * 128 // 2 + 8 * 128 // 16) * 2),  # 36,864
        # TP2 splits the 8 KV heads: 4 per rank
        ("Llama-3.1-8B-Instruct", "auto", 2, 32 * 4 * 256 * 2),  # 65,536
        ("Llama-3.1-8B-Instruct", "auto", 8, 32 * 1 * 256 * 2),  # 16,384
        # TP16: fewer heads than ranks, so each rank keeps one (replicated): max(1, 8 // 16) = 1
        ("Llama-3.1-8B-Instruct", "auto", 16, 32 * 1 * 256 * 2),  # 16,384
        # Llama-2-7B is MHA in fp16: 32 layers x 32 heads x 256 x 2
        ("Llama-2-7b-hf", "auto", 1, 32 * 32 * 256 * 2),  # 524,288
        # Qwen3-8B: 36 layers x 8 KV heads x 256 x 2
        ("Qwen3-8B", "auto", 1, 36 * 8 * 256 * 2),  # 147,456
        # Qwen2.5-7B: 28 layers x 4 KV heads x 256 x 2
        ("Qwen2.5-7B-Instruct", "auto", 1, 28 * 4 * 256 * 2),  # 57,344
        # SmolLM2: 30 layers x 3 KV heads x (64 + 64) x 2
        ("SmolLM2-135M", "auto", 1, 30 * 3 * 128 * 2),  # 23,040
        # DeepSeek-V3 MLA: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2
        ("DeepSeek-V3", "auto", 1, 61 * (512 + 64) * 2),  # 70,272
        ("DeepSeek-V3", "fp8_e4m3", 1, 61 * 576),  # 35,136
        ("DeepSeek-V3", "fp4_e2m1", 1, 61 * (576 // 2 + 576 // 16)),  # 19,764
        # the MLA latent is not split over TP: every rank keeps all of it
        ("DeepSeek-V3", "auto", 8, 70_272),
        ("DeepSeek-V2-Lite", "auto", 1, 27 * 576 * 2),  # 31,104
        # gpt-oss-20b: 12 full + 12 sliding layers of 8 KV heads x 64: 2,048 B per layer per token
        ("gpt-oss-20b", "auto", 1, 24 * 8 * (64 + 64) * 2),  # 49,152
        # gemma-2-9b: 42 layers x 8 KV heads x (256 + 256) x 2
        ("gemma-2-9b-it", "auto", 1, 42 * 8 * 512 * 2),  # 344,064
        ("Mistral-7B-v0.1", "auto", 1, 32 * 8 * 256 * 2),  # 131,072
        # Qwen3-Next: 12 full layers x 2 KV heads x (256 + 256) x 2
        ("Qwen3-Next-80B-A3B-Thinking", "auto", 1, 12 * 2 * 256 * 2 * 2),  # 24,576
        ("Qwen3-Next-80B-A3B-Thinking", "auto", 2, 12 * 1 * 256 * 2 * 2),  # 12,288
        ("Qwen3-Next-80B-A3B-Thinking", "auto", 4, 12 * 1 * 256 * 2 * 2),  # 2 heads over 4 ranks: 1 each
        # Nemotron-H: 10 '*' layers (of 8 KV heads, attention_head_dim 128) x (128 + 128) x 2
        ("Nemotron-H-56B-Base-8K", "auto", 1, 10 * 8 * 256 * 2),  # 40,960
        ("EAGLE3-LLaMA3.1-Instruct-8B", "auto", 1, 1 * 8 * 256 * 2),  # 4,096 (fp16 checkpoint)
    ],
)
def test_bytes_per_token(model: str, kv: str, tp: int, expected: int) -> None:
    assert token_bytes(specs(model, kv, parallel=ParallelState(tp_size=tp))) == expected


@pytest.mark.parametrize(
    ("model", "tp", "ssm_dtype", "expected"),
    [
        # Qwen3-Next gated delta net, 36 layers. conv: (2 x 16 key heads x 128 + 32 value heads x 128) = 8,192
        # channels x (kernel 4 - 1) x 2 bytes (bf16); state: 32 value heads x 128 x 128 x 4 bytes (fp32)
        ("Qwen3-Next-80B-A3B-Thinking", 1, FLOAT32, 36 * (8_192 * 3 * 2 + 32 * 128 * 128 * 4)),  # 77,266,944
        # TP2 halves every head count: 4,096 channels, 16 value heads
        ("Qwen3-Next-80B-A3B-Thinking", 2, FLOAT32, 36 * (4_096 * 3 * 2 + 16 * 128 * 128 * 4)),  # 38,633,472
        ("Qwen3-Next-80B-A3B-Thinking", 1, BFLOAT16, 36 * (8_192 * 3 * 2 + 32 * 128 * 128 * 2)),  # 39,518,208
        # Nemotron-H Mamba-2, 54 'M' layers. conv: (256 heads x 64 + 2 x 8 groups x 256 state) = 20,480
        # channels x (conv_kernel 4 - 1) x 2 bytes; state: 256 heads x 64 x 256 x 4 bytes
        ("Nemotron-H-56B-Base-8K", 1, FLOAT32, 54 * (20_480 * 3 * 2 + 256 * 64 * 256 * 4)),  # 912,605,184
        # TP8: 32 heads, 1 group per rank: (32 x 64 + 2 x 1 x 256) = 2,560 channels
        ("Nemotron-H-56B-Base-8K", 8, FLOAT32, 54 * (2_560 * 3 * 2 + 32 * 64 * 256 * 4)),  # 114,075,648
        ("Llama-3.1-8B-Instruct", 1, FLOAT32, 0),
    ],
)
def test_state_bytes_per_request(model: str, tp: int, ssm_dtype: DType, expected: int) -> None:
    assert state_bytes(specs(model, parallel=ParallelState(tp_size=tp), ssm_dtype=ssm_dtype)) == expected


@pytest.mark.parametrize(
    ("model", "tp", "message"),
    [
        # MambaMixer2 (SGLang 0.5.23 layers/attention/mamba/mamba.py, vLLM 0.34.0 mamba_mixer2.py) asserts
        # n_groups % tp_size == 0 or n_groups == 1: 8 groups split over 1, 2, 4, 8 only (the 256 and 128 heads
        # and Nemotron-H's 64 attention / 8 KV heads would also take 16)
        ("Nemotron-H-56B-Base-8K", 16, r"^--tp-size 16 \(attention TP\) does not fit Nemotron-H-56B-Base-8K: its 8 Mamba "
                                       r"groups \(n_groups\) must divide by it; attention TP sizes that work: 1, 2, 4, 8$"),
        ("Mamba-Codestral-7B-v0.1", 16, r"its 8 Mamba groups \(n_groups\) must divide by it; .*work: 1, 2, 4, 8$"),
        ("Mamba-Codestral-7B-v0.1", 3, r"its 128 mamba_num_heads must divide by it; its 8 Mamba groups .*work: 1, 2, 4, 8$"),
    ],
)
def test_mamba2_groups_must_split_over_tp(model: str, tp: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        specs(model, parallel=ParallelState(tp_size=tp))


def test_one_mamba2_group_is_copied_to_every_rank() -> None:
    # Falcon-H1-0.5B: n_groups 1 passes MambaMixer2's assert at any TP that splits its 24 heads (and its 8 query
    # and 2 KV heads): TP 2 keeps 12 heads x 64 and the whole group, conv (12 x 64 + 2 x 1 x 128) x (4 - 1)
    falcon = load_model_config("tests/model_corpus/Falcon-H1-0.5B-Base.json")
    spec = next(p.spec for p in specs(falcon, parallel=ParallelState(tp_size=2))
                if isinstance(p.spec, RecurrentStateSpec))
    assert spec.conv_shape == (12 * 64 + 2 * 1 * 128, 3)


def test_qwen3_next_state_shapes() -> None:
    spec = next(p.spec for p in specs("Qwen3-Next-80B-A3B-Thinking") if isinstance(p.spec, RecurrentStateSpec))
    assert spec.kind == "gated_delta_net"
    assert spec.conv_shape == (8_192, 3) and spec.ssm_shape == (32, 128, 128)
    assert (spec.conv_dtype, spec.ssm_dtype) == (BFLOAT16, FLOAT32)
    assert spec.bytes_per_request == 8_192 * 3 * 2 + 32 * 128 * 128 * 4  # 2,146,304 per layer


def test_nemotron_h_state_shapes_and_no_spec_for_mlp_layers() -> None:
    placements = specs("Nemotron-H-56B-Base-8K")
    kinds = Counter(type(p.spec).__name__ for p in placements)
    assert kinds == {"RecurrentStateSpec": 54, "FullAttentionSpec": 10}  # the 54 '-' MLP layers cache nothing
    spec = next(p.spec for p in placements if isinstance(p.spec, RecurrentStateSpec))
    assert spec.kind == "mamba2" and spec.conv_shape == (20_480, 3) and spec.ssm_shape == (256, 64, 256)


@pytest.mark.parametrize(
    ("model", "tp", "message"),
    [
        ("Qwen3-Next-80B-A3B-Thinking", 3, r"its 16 linear_num_key_heads must divide by it; .*work: 1, 2, 4, 8, 16$"),
        ("Qwen3-Next-80B-A3B-Thinking", 32, r"its 16 linear_num_key_heads must divide by it; .*work: 1, 2, 4, 8, 16$"),
        ("Nemotron-H-56B-Base-8K", 3, r"its 256 mamba_num_heads must divide by it; .*work: 1, 2, 4, 8$"),
    ],
)
def test_state_heads_must_split_evenly(model: str, tp: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        specs(model, parallel=ParallelState(tp_size=tp))


@pytest.mark.parametrize(
    ("model", "tp", "message"),
    [
        # SGLang 0.5.23: TP divides the query heads; KV heads split, or are replicated when TP is a multiple of them
        ("Llama-3.1-8B-Instruct", 3, r"^--tp-size 3 \(attention TP\) does not fit Llama-3.1-8B-Instruct: its 32 attention "
                                     r"heads \(num_attention_heads\) must divide by it; its 8 KV heads \(num_key_value_heads\) "
                                     r"must divide by it or it by them; attention TP sizes that work: 1, 2, 4, 8, 16, 32$"),
        ("Llama-3.1-8B-Instruct", 64, r"its 32 attention heads .*must divide by it; attention TP sizes that work: 1, 2, 4, 8, 16, 32$"),
        ("DeepSeek-V3", 6, r"its 128 attention heads .*; attention TP sizes that work: 1, 2, 4, 8, 16, 32, 64, 128$"),
    ],
)
def test_attention_tp_must_fit_the_heads(model: str, tp: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        specs(model, parallel=ParallelState(tp_size=tp))


def test_kv_heads_that_neither_split_nor_replicate_are_refused() -> None:
    # 24 query heads, 6 KV heads: TP 4 divides the query heads, but 6 % 4 and 4 % 6 are both non-zero
    model = tiny_model_config(hidden_size=24 * 16, num_attention_heads=24, num_key_value_heads=6)
    with pytest.raises(ConfigError, match=r"its 6 KV heads .* or it by them; attention TP sizes that work: 1, 2, 3, 6, 12, 24$"):
        specs(model, parallel=ParallelState(tp_size=4))
    assert token_bytes(specs(model, parallel=ParallelState(tp_size=12))) == 2 * 1 * 2 * 16 * 2  # replicated: 1 head


def test_attention_dp_splits_heads_over_attention_tp_only() -> None:
    # TP8 with attention DP 4: heads split over 8 / 4 = 2 ranks -> 4 heads: 32 x 4 x 256 x 2
    assert token_bytes(specs("Llama-3.1-8B-Instruct", parallel=ParallelState(tp_size=8, attention_dp_size=4))) == 65_536
    # attention DP 8: every rank holds all 8 heads
    assert token_bytes(specs("Llama-3.1-8B-Instruct", parallel=ParallelState(tp_size=8, attention_dp_size=8))) == 131_072


def test_sliding_and_full_specs_of_gpt_oss() -> None:
    placements = specs("gpt-oss-20b")
    sliding = [p for p in placements if isinstance(p.spec, SlidingWindowSpec)]
    full = [p for p in placements if isinstance(p.spec, FullAttentionSpec)]
    assert [p.layer_id for p in sliding] == list(range(0, 24, 2))
    assert [p.layer_id for p in full] == list(range(1, 24, 2))
    assert {p.spec.window for p in sliding} == {128}
    assert {p.spec.bytes_per_token for p in placements} == {8 * (64 + 64) * 2}  # 2,048
    assert {p.spec.pool_kind for p in sliding} == {"swa"} and {p.spec.pool_kind for p in full} == {"full"}


def test_mla_spec() -> None:
    spec = specs("DeepSeek-V3")[0].spec
    assert isinstance(spec, MLASpec) and spec.pool_kind == "mla"
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim, spec.bytes_per_token) == (512, 64, 1_152)


def test_fp4_needs_a_multiple_of_16_values() -> None:
    # one KV head of 8: 8 values per K is not a whole number of 16-value scale groups
    model = tiny_model_config(hidden_size=32, num_attention_heads=4, num_key_value_heads=1)
    with pytest.raises(ConfigError, match="8 elements cannot be stored as fp4_e2m1: the count must be a multiple of 16"):
        token_bytes(specs(model, "fp4_e2m1"))


@pytest.mark.parametrize(
    ("dtype", "elements", "expected"),
    [("bfloat16", 1024, 2048), ("float32", 3, 12), ("fp8_e4m3", 7, 7), ("fp4_e2m1", 32, 16 + 2)],
)
def test_kv_dtype_bytes_for(dtype: str, elements: int, expected: int) -> None:
    assert KV_CACHE_DTYPES[dtype].bytes_for(elements) == expected


# ---- pipeline ranks ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("model", "pp", "ranges", "bytes_per_rank"),
    [
        # 32 layers over 2 ranks: 16 + 16, each 16 x 8 x 256 x 2
        ("Llama-3.1-8B-Instruct", 2, [(0, 16), (16, 32)], [65_536, 65_536]),
        # 32 over 3: the last ranks take the remainder (SGLang 0.5.23's get_pp_indices): 10 + 11 + 11 layers of 4,096 B
        ("Llama-3.1-8B-Instruct", 3, [(0, 10), (10, 21), (21, 32)], [40_960, 45_056, 45_056]),
        # 61 MLA layers over 2: 30 + 31 layers of 1,152 B
        ("DeepSeek-V3", 2, [(0, 30), (30, 61)], [34_560, 35_712]),
        # gemma over 2: rank 0 has layers 0..20 (11 sliding, 10 full), rank 1 21..41 (10 sliding, 11 full);
        # 8,192 B per layer either way
        ("gemma-2-9b-it", 2, [(0, 21), (21, 42)], [172_032, 172_032]),
        # Qwen3-Next over 4: 12 layers each, 3 of them full (2 x 256 x 2 x 2 = 2,048 B)
        ("Qwen3-Next-80B-A3B-Thinking", 4, [(0, 12), (12, 24), (24, 36), (36, 48)], [6_144] * 4),
    ],
)
def test_pipeline_ranks_split_layers_and_bytes(model: str, pp: int, ranges: list[tuple[int, int]],
                                               bytes_per_rank: list[int]) -> None:
    config = load_model_config(model)
    total = token_bytes(specs(model))
    got_ranges, got_bytes = [], []
    for rank in range(pp):
        parallel = ParallelState(pp_size=pp, pp_rank=rank)
        layers = parallel.layer_range(config.num_hidden_layers)
        placements = specs(model, parallel=parallel)
        assert all(p.layer_id in layers for p in placements)
        got_ranges.append((layers.start, layers.stop))
        got_bytes.append(token_bytes(placements))
    assert got_ranges == ranges
    assert got_bytes == bytes_per_rank
    assert sum(got_bytes) == total


def test_qwen3_next_pipeline_ranks_split_the_state_too() -> None:
    per_layer = 8_192 * 3 * 2 + 32 * 128 * 128 * 4  # 2,146,304
    for rank in range(4):
        assert state_bytes(specs("Qwen3-Next-80B-A3B-Thinking", parallel=ParallelState(pp_size=4, pp_rank=rank))) == 9 * per_layer


def test_explicit_layer_ids_override_the_pipeline_range() -> None:
    model = load_model_config("gpt-oss-20b")
    dtype = KV_CACHE_DTYPES["bfloat16"]
    placements = model_layer_specs(model, ParallelState(), dtype, model_dtype=BFLOAT16, layer_ids=range(3, 6))
    assert [(p.layer_id, type(p.spec).__name__) for p in placements] == [
        (3, "FullAttentionSpec"), (4, "SlidingWindowSpec"), (5, "FullAttentionSpec")]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 2, "tp_rank": 2}, "rank out of range: tp 2/2"),
        ({"pp_size": 2, "pp_rank": -1}, "rank out of range"),
        ({"tp_size": 6, "attention_dp_size": 4}, "tp_size 6 is not a multiple of attention_dp_size 4"),
    ],
)
def test_parallel_state_validates(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ParallelState(**kwargs)


def test_more_pipeline_ranks_than_layers_is_refused() -> None:
    with pytest.raises(ConfigError, match="1 layers cannot be split over --pp-size 2; use at most 1"):
        specs("EAGLE3-LLaMA3.1-Instruct-8B", parallel=ParallelState(pp_size=2, pp_rank=0))


def test_spec_types_are_frozen_and_hashable() -> None:
    spec = FullAttentionSpec(8, 128, 128, KV_CACHE_DTYPES["bfloat16"])
    assert spec == FullAttentionSpec(8, 128, 128, KV_CACHE_DTYPES["bfloat16"]) and hash(spec) == hash(
        FullAttentionSpec(8, 128, 128, KV_CACHE_DTYPES["bfloat16"]))
    with pytest.raises(AttributeError):
        spec.kv_heads = 4  # type: ignore[misc]
    assert isinstance(spec.dtype, KVCacheDtype)
