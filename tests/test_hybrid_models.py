"""Hybrid models through the whole engine: sliding-window, linear-attention and Mamba pools, FP4."""

from __future__ import annotations

import msgspec
import pytest
import torch

from containers import EngineContainer
from kvcache.allocators import SWATokenToKVPoolAllocator
from kvcache.byte_units import GiB, MiB
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.pools import HybridSWAKVPool
from kvcache.models.presets import preset_names


@pytest.fixture
def bootstrap(make_engine):  # type: ignore[no-untyped-def]
    """bootstrap(model, device=..., probe_gib=..., **server_args) -> a bootstrapped engine (shut down by make_engine)."""
    def run(model: str, *, device: str, probe_gib: int, **args) -> EngineContainer:  # type: ignore[no-untyped-def]
        engine = make_engine(model=model, probe=FixedMemoryProbe(total_bytes=probe_gib * GiB), device=device, **args)
        engine.engine().bootstrap()
        return engine
    return run


@pytest.mark.parametrize("model", [m for m in preset_names() if not m.startswith("EAGLE")])
def test_every_preset_builds_on_meta_within_its_budget(model: str, bootstrap) -> None:
    engine = bootstrap(model, device="meta", probe_gib=2000, kv_cache_memory=40 * GiB)
    runner = engine.engine().target
    plan = runner.memory_pool_config
    assert runner.kv_cache.allocated_bytes == plan.total_bytes <= 40 * GiB
    msgspec.json.encode(plan.to_dict())


@pytest.mark.parametrize(
    "model", ["gpt-oss-20b", "gemma-2-9b-it", "Mistral-7B-v0.1", "Qwen3-Next-80B-A3B-Thinking", "Nemotron-H-56B-Base-8K"]
)
def test_hybrid_pools_build_on_cpu(model: str, make_engine) -> None:
    # Nemotron-H's state is 912,605,184 B a request, so keep 3 slots (+ padding) without a radix cache
    engine = make_engine(model=model, probe=FixedMemoryProbe(total_bytes=8 * GiB), kv_cache_memory=4 * GiB,
                         context_length=4096, max_mamba_cache_size=3, disable_radix_cache=True)
    configurator = engine.target.configurator()
    result = configurator.configure(pre_model_load_memory=8 * GiB)  # weights skipped: pools only
    assert result.allocated_bytes == result.memory_pool_config.total_bytes <= 4 * GiB


def test_gpt_oss_pairs_a_full_and_a_sliding_pool(bootstrap) -> None:
    engine = bootstrap("gpt-oss-20b", device="meta", probe_gib=80, kv_cache_memory=10 * GiB, page_size=16)
    runner = engine.engine().target
    plan = runner.memory_pool_config
    full, swa = plan.pool("full"), plan.pool("swa")
    # 12 full and 12 sliding layers of 8 KV heads x 64: 12 x 8 x 128 x 2 = 24,576 B/token each
    assert (full.num_layers, full.bytes_per_token) == (12, 24_576)
    assert (swa.num_layers, swa.bytes_per_token) == (12, 24_576)
    assert plan.bytes_per_token == 24_576  # only the full pool holds every token
    # swa tokens = align_down(int(full x 0.8), page)
    assert swa.num_tokens == full.num_tokens * 4 // 5 // 16 * 16
    assert isinstance(runner.token_to_kv_pool, HybridSWAKVPool)
    allocator = runner.token_to_kv_pool_allocator
    assert isinstance(allocator, SWATokenToKVPoolAllocator)
    # the hybrid pool is built after the allocator (it takes the allocator's map), then attached to it
    assert allocator.get_kvcache() is runner.token_to_kv_pool
    assert allocator.full_attn_allocator.get_kvcache() is runner.token_to_kv_pool.full_kv_pool
    assert allocator.swa_attn_allocator.get_kvcache() is runner.token_to_kv_pool.swa_kv_pool


def test_a_sliding_pool_too_small_for_one_window_names_a_ratio(bootstrap) -> None:
    from kvcache.errors import BudgetBelowOneRequestError

    with pytest.raises(BudgetBelowOneRequestError, match="--swa-full-tokens-ratio 0\\.") as info:
        # 4 GiB hold ~23.7k full tokens (21 x 8 x 512 x 2 = 172,032 B each + 5% of that for the window pool),
        # so the window pool gets ~1.2k tokens: fewer than one 4,096 window plus a page
        bootstrap("gemma-2-9b-it", device="meta", probe_gib=80, kv_cache_memory=4 * GiB,
                  swa_full_tokens_ratio=0.05, context_length=8192, enable_hybrid_swa_memory=True)
    ratio = float(str(info.value).split("--swa-full-tokens-ratio ")[1].split()[0])
    engine = bootstrap("gemma-2-9b-it", device="meta", probe_gib=80, kv_cache_memory=4 * GiB,
                       swa_full_tokens_ratio=ratio, context_length=8192, enable_hybrid_swa_memory=True)
    plan = engine.engine().target.memory_pool_config
    assert plan.pool("swa").num_tokens >= 4096 + 1  # one window plus a page


def test_all_sliding_mistral_holds_every_token_in_one_pool(bootstrap) -> None:
    # SGLang 0.5.23 keeps MistralForCausalLM in one full pool; asked for a window pool, it holds every token too
    engine = bootstrap("Mistral-7B-v0.1", device="meta", probe_gib=80, kv_cache_memory=8 * GiB)
    full = engine.engine().target.memory_pool_config
    assert [(p.name, p.kind) for p in full.kv_pools] == [("full", "full")]
    engine = bootstrap("Mistral-7B-v0.1", device="meta", probe_gib=80, kv_cache_memory=8 * GiB,
                       enable_hybrid_swa_memory=True)
    plan = engine.engine().target.memory_pool_config
    assert plan.max_total_num_tokens == full.max_total_num_tokens
    assert [p.name for p in plan.kv_pools] == ["swa"]
    assert plan.pool("swa").num_tokens == plan.max_total_num_tokens
    assert plan.bytes_per_token == 32 * 8 * 256 * 2  # 131,072


@pytest.mark.parametrize(("radix", "overlap", "page", "requests"),
                         [(True, True, 1, 57), (True, False, 1, 96), (True, False, 64, 72), (False, True, 1, 288)])
def test_qwen3_next_state_slots_cap_requests(radix: bool, overlap: bool, page: int, requests: int, bootstrap) -> None:
    # state share = 44 GiB x 0.9 / 1.9 = 22,379,040,121 B -> 289 slots of 77,266,944 B; 288 usable.
    # SGLang 0.5.23 slots per request with the radix cache: 3, plus tracking slots when it keeps states
    # mid-sequence (overlap scheduler on, or pages above one token): 2 with overlap (288 // 5 = 57), 1 without
    # (288 // 4 = 72); without overlap at page 1 no tracking (288 // 3 = 96); without the radix cache 1.
    engine = bootstrap("Qwen3-Next-80B-A3B-Thinking", device="meta", probe_gib=2000, kv_cache_memory=44 * GiB,
                       disable_radix_cache=not radix, disable_overlap_schedule=not overlap, page_size=page)
    plan = engine.engine().target.memory_pool_config
    assert plan.state_pool is not None
    assert plan.state_pool.bytes_per_slot == 77_266_944
    assert plan.state_pool.num_slots == 289
    assert plan.max_running_requests == requests
    assert plan.bytes_per_token == 24_576  # 12 full layers x 2 KV heads x 256 x 2 x 2


def test_max_mamba_cache_size_overrides_the_ratio(bootstrap) -> None:
    engine = bootstrap("Nemotron-H-56B-Base-8K", device="meta", probe_gib=2000, kv_cache_memory=40 * GiB,
                       max_mamba_cache_size=30, disable_radix_cache=True)
    plan = engine.engine().target.memory_pool_config
    assert plan.state_pool.num_slots == 31 and plan.max_running_requests == 30


def test_fp4_kv_takes_nine_sixteenths_of_a_byte_per_value(bootstrap) -> None:
    engine = bootstrap("Llama-3.1-8B-Instruct", device="meta", probe_gib=80, kv_cache_memory=8 * GiB,
                       kv_cache_dtype="fp4_e2m1")
    plan = engine.engine().target.memory_pool_config
    assert plan.bytes_per_token == 32 * 8 * 256 * 9 // 16  # 36,864


def test_fp4_pool_on_cpu_holds_packed_values_and_scales(make_engine) -> None:
    engine = make_engine(model="SmolLM2-135M", probe=FixedMemoryProbe(total_bytes=GiB), kv_cache_memory=16 * MiB,
                         kv_cache_dtype="fp4_e2m1", context_length=256)
    result = engine.target.configurator().configure(pre_model_load_memory=GiB)
    pool = result.token_to_kv_pool
    loc = result.token_to_kv_pool_allocator.alloc(2)
    k = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    pool.set_kv_buffer(0, loc, k, k)
    assert pool.get_key_buffer(0).shape[-1] == 32 and pool.get_key_scales(0).shape[-1] == 4
