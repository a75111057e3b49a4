"""vLLM 0.34.0's answer (kvcache.engines.vllm_plan): block size, groups, num_gpu_blocks and max concurrency.

Every number is worked out by hand from the corpus configs' public fields and vLLM 0.34.0's rules
(block size 64; a window keeps window - 1 + 2 x 8192 in-flight tokens, plus one block; 100 GiB =
107,374,182,400 bytes of KV memory). tests/test_vllm_plan_reference.py runs vLLM's own code on the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvcache.engines import vllm_rules
from kvcache.engines.vllm_answer import vllm_answer, vllm_available_bytes
from kvcache.engines.vllm_layers import VllmSettings, vllm_layer_specs
from kvcache.engines.vllm_plan import VllmPlan, plan_vllm
from kvcache.errors import BudgetBelowOneRequestError, ConfigError
from kvcache.byte_units import GiB
from kvcache.inputs.dtypes import BFLOAT16, FLOAT32, resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.runtime_reserve import RuntimeShape
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).with_name("model_corpus")
HUNDRED_GIB = 100 * GiB


def plan(name: str, available: int = HUNDRED_GIB, kv_dtype: str = "auto", **settings: int) -> VllmPlan:
    model = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    layers = vllm_layer_specs(model, ParallelState(), resolve_kv_cache_dtype(kv_dtype, dtype), model_dtype=dtype)
    return plan_vllm(layers, model.layer_kinds, available_bytes=available,
                     settings=VllmSettings(**{"max_model_len": 32768, **settings}))


def shape(p: VllmPlan) -> list[tuple[str, int, int]]:
    """(kind, layers, blocks a request takes) of each group."""
    return [(g.kind, len(g.layer_pages), g.blocks_per_request) for g in p.groups]


def test_full_attention_one_group_of_every_layer() -> None:
    # Qwen3-0.6B: 28 layers x 8 KV heads x 128 x (K, V) x 2 B = 4,096 B per token and layer;
    # a 64-token block of all 28 layers is 28 x 262,144 = 7,340,032 B; 32,768 tokens take 512 blocks
    p = plan("Qwen3-0.6B")
    assert (p.block_size, shape(p), p.bytes_per_block) == (64, [("full", 28, 512)], 7_340_032)
    assert p.num_blocks == 14_628  # 107,374,182,400 // 7,340,032
    assert p.max_concurrency == 14_628 / 512 and p.kv_cache_tokens == 936_192


def test_block_size_flag_changes_the_page_not_the_tokens() -> None:
    p = plan("Qwen3-0.6B", block_size=16)
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (1_835_008, 58_514, 2048)


def test_sliding_window_and_full_layers_split_into_equal_groups() -> None:
    # gpt-oss-120b: 18 window-128 + 18 full layers of 8 x 64 x 2 x 2 = 2,048 B/token: two groups of 18,
    # 18 x 131,072 = 2,359,296 B a block; a window layer keeps cdiv(127 + 16,384, 64) + 1 = 259 blocks
    p = plan("gpt-oss-120b")
    assert shape(p) == [("sliding", 18, 259), ("full", 18, 512)]
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (2_359_296, 45_511, 771)


def test_gemma3_pads_its_full_group_to_the_window_groups() -> None:
    # gemma-3-27b-it: 52 window-1024 and 10 full layers, 16 x 128 x 2 x 2 = 8,192 B/token; group size 10:
    # six window groups (9, 9, 9, 9, 8, 8 layers), one full; 10 x 524,288 = 5,242,880 B a block;
    # a window group takes cdiv(1,023 + 16,384, 64) + 1 = 273 blocks
    p = plan("gemma-3-27b-it")
    assert shape(p) == [("sliding", n, 273) for n in (9, 9, 9, 9, 8, 8)] + [("full", 10, 512)]
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (5_242_880, 20_480, 6 * 273 + 512)


def test_chunked_attention_turns_the_hybrid_manager_off() -> None:
    # Llama-4-Scout: vLLM 0.34.0 disables its hybrid manager for chunked local attention, so the 36
    # chunked layers take full-attention blocks: one group of 48 x 8 x 128 x 2 x 2 x 64 = 12,582,912 B
    p = plan("Llama-4-Scout-17B-16E-Instruct")
    assert (shape(p), p.bytes_per_block, p.num_blocks) == ([("full", 48, 512)], 12_582_912, 8_533)


def test_mamba_hybrid_grows_the_block_until_a_page_holds_a_state() -> None:
    # Bamba-9B: Mamba-2 state (bf16, as vLLM keeps it) = (128 x 64 + 2 x 128) x 3 x 2 + 128 x 64 x 128 x 2
    # = 2,147,840 B; an attention token is 8 x 128 x 2 x 2 = 4,096 B: block 64 x cdiv(2,147,840, 262,144) = 576,
    # page 2,359,296 B (the state padded to it); 3 attention layers set the group size: 29 Mamba layers
    # (first in layer order) make 10 groups
    p = plan("Bamba-9B")
    assert p.block_size == 576 and shape(p) == [("mamba", n, 1) for n in [3] * 9 + [2]] + [("full", 3, 57)]
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (7_077_888, 15_170, 67)


def test_nemotron_h_keeps_its_ssm_state_in_float32() -> None:
    assert vllm_rules.ssm_state_dtype("NemotronHForCausalLM", {"mamba_ssm_cache_dtype": "float32"}, "mamba",
                                      BFLOAT16) == FLOAT32
    assert vllm_rules.ssm_state_dtype("BambaForCausalLM", {}, "mamba", BFLOAT16) == BFLOAT16
    assert vllm_rules.ssm_state_dtype("KimiLinearForCausalLM", {}, "kda", BFLOAT16) == FLOAT32


def test_one_request_must_fit_besides_the_null_block() -> None:
    block = 7_340_032  # Qwen3-0.6B, 512 blocks a request
    assert plan("Qwen3-0.6B", available=513 * block).num_blocks == 513
    with pytest.raises(BudgetBelowOneRequestError, match="needs 512 blocks of 7,340,032 B, and 511 fit") as e:
        plan("Qwen3-0.6B", available=512 * block)
    assert (e.value.needed_bytes, e.value.available_bytes) == (513 * block, 512 * block)


@pytest.mark.parametrize(
    ("name", "kv_dtype", "block_size", "cache_layers", "bytes_per_block", "num_blocks"),
    [
        # DeepSeek-V3.2: 61 layers, each an indexer key of 128 + 128 / 128 x 4 = 132 B (uint8, whatever the KV dtype)
        # and a latent of (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 = 1,152 B in bfloat16: one group of 122
        # cache layers, 64 x 1,284 x 61 = 5,012,736 B a block; 107,374,182,400 // that = 21,420
        ("DeepSeek-V3.2", "auto", None, 122, 5_012_736, 21_420),
        # fp8: FlashMLA sparse's fp8_ds_mla row, 512 fp8 + 4 x 4 scales + 64 x 2 RoPE = 656 B; 128-token blocks:
        # 128 x (656 + 132) x 61 = 6,152,704 B
        ("DeepSeek-V3.2", "fp8_e4m3", 128, 122, 6_152_704, 17_451),
        # GLM-5: 78 such layers, 64 x 1,284 x 78 = 6,409,728 B a block
        ("GLM-5", "auto", None, 156, 6_409_728, 16_751),
    ],
)
def test_sparse_mla_keeps_the_indexer_key_beside_the_latent_in_one_group(
        name: str, kv_dtype: str, block_size: int | None, cache_layers: int, bytes_per_block: int,
        num_blocks: int) -> None:
    model = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    layers = vllm_layer_specs(model, ParallelState(), resolve_kv_cache_dtype(kv_dtype, BFLOAT16),
                              model_dtype=BFLOAT16)
    p = plan_vllm(layers, model.layer_kinds, available_bytes=HUNDRED_GIB,
                  settings=VllmSettings(max_model_len=32768, block_size=block_size))
    size = block_size or 64
    assert shape(p) == [("mla", cache_layers, 32768 // size)] and p.block_size == size
    assert (p.bytes_per_block, p.num_blocks) == (bytes_per_block, num_blocks)
    assert p.max_concurrency == num_blocks / (32768 // size)


@pytest.mark.parametrize(
    ("kv_dtype", "block_size", "message"),
    [
        ("fp8_e5m2", None, "--kv-cache-dtype fp8_e5m2: vLLM 0.34.0 has no sparse MLA backend for it"),
        ("float32", None, "--kv-cache-dtype float32: vLLM 0.34.0 has no sparse MLA backend for it"),
        ("auto", 16, "--block-size 16: vLLM 0.34.0's sparse MLA indexer takes blocks of 64 tokens"),
        ("auto", 96, "use --block-size 64"),
    ],
)
def test_sparse_mla_settings_vllm_has_no_kernel_for_are_refused(kv_dtype: str, block_size: int | None,
                                                                message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan("DeepSeek-V3.2", **({"block_size": block_size} if block_size else {}),
             **({} if kv_dtype == "auto" else {"kv_dtype": kv_dtype}))


def test_fp4_is_refused_not_guessed() -> None:
    model = model_config_from_hf(CORPUS / "Qwen3-0.6B.json", name="Qwen3-0.6B")
    with pytest.raises(ConfigError, match="fp4_e2m1 is not modelled for --engine vllm"):
        vllm_layer_specs(model, ParallelState(), resolve_kv_cache_dtype("fp4_e2m1", BFLOAT16),
                         model_dtype=BFLOAT16)


def test_budget_is_the_utilized_card_less_what_vllm_measures() -> None:
    total = 150_109_880_320  # an H200
    assert vllm_available_bytes(total_bytes=total, gpu_memory_utilization=0.9, weights_bytes=10 * GiB,
                                runtime_bytes=4 * GiB) == 135_098_892_288 - 14 * GiB
    assert vllm_rules.default_max_num_batched_tokens(total) == 8192


def test_answer_on_an_h200_names_the_estimated_runtime() -> None:
    # H200 150,109,880,320 B at utilization 1.0 (vLLM's default), Qwen3-0.6B's dummy weights 1,193,279,488 B;
    # the runtime estimate is the project's reserve for the card: 512 + 1.5 x 8,192 + 128 + 2 x 256
    # + 8 x 58 prefill graphs = 13,904 MiB = 14,579,400,704 B
    model = model_config_from_hf(CORPUS / "Qwen3-0.6B.json", name="Qwen3-0.6B")
    answer = vllm_answer(model, ParallelState(), resolve_kv_cache_dtype("auto", BFLOAT16),
                         model_dtype=BFLOAT16, total_bytes=150_109_880_320, weights_bytes=1_193_279_488,
                         runtime=RuntimeShape(cuda_graphs=True), max_model_len=32768)
    assert (answer.requested_bytes, answer.estimated_runtime_bytes) == (150_109_880_320, 14_579_400_704)
    assert answer.available_bytes == 134_337_200_128 and answer.max_num_batched_tokens == 8192
    assert (answer.num_gpu_blocks, answer.blocks_per_request, answer.kv_cache_tokens) == (18_301, 512, 1_171_264)


def align_plan(name: str, **settings: int) -> VllmPlan:
    """The plan with prefix caching on (vLLM's default): Mamba layers in mamba_cache_mode "align", with the prefill
    checkpoint their mixer declares."""
    model = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    return plan(name, mamba_cache_mode="align",  # type: ignore[arg-type]
                mamba_checkpoint=vllm_rules.mamba_checkpoint(model.architecture, model.hf_config), **settings)


def test_prefix_caching_gives_each_mamba_group_three_blocks_a_request() -> None:
    # Bamba-9B (Mamba-2 mixer: one prefill checkpoint block): the running state, the last block-aligned state and
    # the checkpoint: 10 Mamba groups x 3 + the full group's 57 = 87 blocks (67 without prefix caching);
    # the block (576) and the pool (15,170 blocks) do not change
    p = align_plan("Bamba-9B")
    assert p.block_size == 576 and shape(p) == [("mamba", n, 3) for n in [3] * 9 + [2]] + [("full", 3, 57)]
    assert (p.num_blocks, p.blocks_per_request) == (15_170, 87) and p.max_concurrency == 15_170 / 87


def test_a_mixer_without_prefill_checkpoints_keeps_two_states() -> None:
    # Jamba's Mamba-1 mixer and Kimi-Linear's KDA without a bounded gate (Triton prefill) declare no checkpoint:
    # Jamba 7 Mamba groups x 2 + 256 full blocks = 270 (263 in "none"); Kimi-Linear 3 x 2 + 18 = 24 (21)
    assert align_plan("Jamba-v0.1").blocks_per_request == 270
    assert align_plan("Kimi-Linear-48B-A3B-Instruct").blocks_per_request == 24
    kda = {"linear_attn_config": {"head_dim": 128, "gate_lower_bound": -5.0}}
    assert vllm_rules.mamba_checkpoint("KimiLinearForCausalLM", kda) == vllm_rules.MambaCheckpoint(1, 16)


def test_gated_delta_net_checkpoints_align_the_block_to_64() -> None:
    # Qwen3.5-27B at --block-size 16: GDN state 3,207,168 B, attention token 4 KV heads x 256 x 2 x 2 B = 4,096 B.
    # "none": 16 x cdiv(3,207,168, 16 x 4,096) = 16 x 49 = 784; "align": FlashInfer's checkpoints take blocks of
    # lcm(16, 64) = 64 tokens: 64 x cdiv(3,207,168, 64 x 4,096) = 64 x 13 = 832; a request takes 3 Mamba groups
    # x 3 + cdiv(32,768, 832) = 40 full blocks = 49
    assert plan("Qwen3.5-27B", block_size=16).block_size == 784
    p = align_plan("Qwen3.5-27B", block_size=16)
    assert (p.block_size, p.blocks_per_request) == (832, 49)
