"""One plan: the planner's cost is the plan's total, each worker's buffers come from one arena
of exactly the plan's bytes, a guard refuses any difference, and FP4 has one byte formula."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest
import torch

from kvcache.allocators.factory import allocator_for_plan
from kvcache.memory import device_buffers
from kvcache.pools.builder import build_worker_pools
from kvcache.sizing.pool_layout import CacheLayout, KVPoolGroup
from kvcache.allocators import TokenToKVPoolAllocator
from kvcache.byte_units import GiB, MiB
from kvcache.memory.device_buffers import Arena
from kvcache.sizing.arena_sizes import arena_size
from kvcache.pools.planned_views import carve_slots
from kvcache.sizing.layer_specs import FullAttentionSpec
from kvcache.sizing.tensor_plan import PlannedSlot, per_layer
from kvcache.testing.arena_census import ArenaCensus
from kvcache.errors import ConfigError, PlanMismatchError
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.sizing.planning import candidate_plan, plan_cost, plan_pool_sizes
from kvcache.inputs.dtypes import KV_CACHE_DTYPES
from kvcache.models.presets import load_model_config
from kvcache.testing import tiny_model_config
from kvcache.testing.pool_plans import standalone_kv_pool
from kvcache.testing.allocator_plans import token_allocator

META = torch.device("meta")


def configured(make_engine: Any, model: Any, **args: Any) -> Any:
    engine = make_engine(model=model, **args)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=8 * GiB))
    return engine.target.configurator().configure(pre_model_load_memory=8 * GiB)


@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("Llama-3.1-8B-Instruct", {"context_length": 8192}),
        ("DeepSeek-V2-Lite", {"page_size": 64, "context_length": 4096}),
        ("gpt-oss-20b", {"page_size": 16, "context_length": 8192}),
        ("Qwen3-Next-80B-A3B-Thinking", {"context_length": 8192}),
    ],
)
def test_a_worker_allocates_one_arena_of_exactly_the_plan(make_engine: Any, model: str, args: dict[str, Any]) -> None:
    result = configured(make_engine, load_model_config(model), device="meta", kv_cache_memory=3 * GiB, **args)
    plan = result.memory_pool_config
    assert result.allocated_bytes == plan.arena_bytes() == plan.total_bytes <= 3 * GiB
    assert plan.total_bytes == arena_size(sum(plan.worker_buffers().values())) == sum(plan.buffers.values())
    assert plan.total_bytes % (2 * MiB) == 0
    pool = result.req_to_token_pool
    on_device = [t for t in pool.__dict__.values() if isinstance(t, torch.Tensor) and t.device == pool.device]
    assert {t.untyped_storage()._cdata for t in on_device} == {pool.req_to_token.untyped_storage()._cdata}
    assert pool.req_generation.device.type == "cpu"  # the request table's only other tensor: host counters
    assert result.token_to_kv_pool_allocator.nbytes == plan.allocator_index_bytes


def test_the_planner_charges_what_the_plan_it_returns_allocates() -> None:
    from tests.test_planning import full, request  # the hand-built requests of the planner's own tests

    req = request(64 * MiB, (full(4096),), max_running_requests=16)
    plan = plan_pool_sizes(req)
    t, page = plan.max_total_num_tokens, plan.page_size
    assert plan_cost(req, t, 0) == plan.total_bytes == candidate_plan(req, t, 0).total_bytes <= 64 * MiB
    assert candidate_plan(req, t + page, 0).total_bytes > 64 * MiB  # one more page would not fit


def test_a_draft_worker_has_its_own_arena_and_the_target_pays_for_both(make_engine: Any) -> None:
    engine = make_engine(device="meta", kv_cache_memory=2 * GiB, speculative_algorithm="EAGLE3",
                         speculative_draft_model="EAGLE3-LLaMA3.1-Instruct-8B",
                         model=load_model_config("Llama-3.1-8B-Instruct"), context_length=4096)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=80 * GiB))
    runtime = engine.engine()
    runtime.bootstrap()
    plan = runtime.target.memory_pool_config
    draft_arena = plan.arena_bytes(draft=True)
    assert set(plan.worker_buffers(draft=True)) == {"kv_draft_full"}
    assert runtime.draft.kv_cache.allocated_bytes == draft_arena >= 10 * MiB
    assert runtime.target.kv_cache.allocated_bytes + draft_arena == plan.total_bytes <= 2 * GiB


def _checking_allocator(*, plan: Any, device: torch.device, kvcache: Any = None,
                        views: Any = None) -> TokenToKVPoolAllocator:
    """An allocator with is-free flags the plan did not pay for."""
    return token_allocator(size=plan.max_total_num_tokens, device=device, check_frees=True)


def _undersized_allocator(*, plan: Any, device: torch.device, kvcache: Any = None,
                          views: Any = None) -> TokenToKVPoolAllocator:
    """An allocator over half the plan's tokens: smaller index buffers than planned."""
    return token_allocator(size=plan.max_total_num_tokens // 2, device=device)


def _own_buffers_allocator(*, plan: Any, device: torch.device, kvcache: Any = None,
                           views: Any = None) -> TokenToKVPoolAllocator:
    """The plan's allocator, shapes and all, on buffers of its own instead of the arena's views."""
    return token_allocator(size=plan.max_total_num_tokens, device=device)


@pytest.mark.parametrize("factory", [_checking_allocator, _undersized_allocator, _own_buffers_allocator])
def test_the_guard_refuses_a_build_that_differs_from_the_plan(make_engine: Any, factory: Any) -> None:
    from dependency_injector import providers

    engine = make_engine(kv_cache_memory=64 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    engine.target.allocator_factory.override(providers.Callable(factory))
    with ArenaCensus().installed() as census, pytest.raises(PlanMismatchError, match="plan"):
        engine.target.configurator().configure(pre_model_load_memory=GiB)
    gc.collect()
    assert census.made >= 1 and census.alive() == 0  # the arena, and every view of it, is gone


def test_a_plan_that_charges_other_bytes_than_its_tensors_take_is_refused_before_any_arena() -> None:
    """What the carve does not make true: the bytes the plan charges (from bytes per token) are its tensor list's.
    A plan decoded or built by hand that charges 258 B a token for tensors of 256 B is refused, naming both."""
    from tests.test_planning import request

    spec = FullAttentionSpec(2, 16, 16, KV_CACHE_DTYPES["bfloat16"])  # 2 layers x (K + V) x 2 x 16 x 2 B = 256 B
    group = KVPoolGroup(name="full", spec=spec, layer_ids=(0, 1), paired_with_full=False)
    plan = candidate_plan(request(64 * MiB, (group.demand(),), max_running_requests=4), 1000, 0)
    wrong = msgspec.structs.replace(plan, kv_pools=(msgspec.structs.replace(plan.pool("full"), bytes_per_token=258),))
    with ArenaCensus().installed() as census, pytest.raises(PlanMismatchError) as refused:
        build_worker_pools(plan=wrong, layout=CacheLayout(kv_groups=(group,)), device=META,
                           allocator_factory=allocator_for_plan)
    # 1,001 rows (1,000 tokens + the padding row): 258,258 B -> 258,560 B charged; 256,256 B -> 256,512 B of tensors
    assert str(refused.value) == ("the plan charges other bytes than its tensors take in 1 of 3 buffers (name: charged, "
                                  "tensors): kv_full: 258,560 B, 256,512 B")
    assert census.made == 0
    build_worker_pools(plan=plan, layout=CacheLayout(kv_groups=(group,)), device=META, allocator_factory=allocator_for_plan)


def test_an_arena_refuses_a_buffer_beyond_its_size() -> None:
    arena = Arena(10 * MiB, torch.device("cpu"))
    arena.carve_slot([((8 * MiB,), torch.uint8)])
    with pytest.raises(PlanMismatchError, match="does not fit in the KV arena: 8,388,608 of 10,485,760 B"):
        arena.carve_slot([((2 * MiB + 1,), torch.uint8)])  # a 2 MiB + 512 B slot
    assert arena.used == 8 * MiB


def test_a_pool_built_on_views_of_an_arena_holds_them_and_counts_its_slot() -> None:
    arena = Arena(10 * MiB, META)
    row = FullAttentionSpec(2, 64, 64, KV_CACHE_DTYPES["bfloat16"]).row_tensors()
    views = carve_slots(arena, [PlannedSlot("kv_full", per_layer("kv_full", (0, 1, 2), row, 1001))])
    (small,) = arena.carve_slot([((100,), torch.int64)])
    pool = standalone_kv_pool(FullAttentionSpec(2, 64, 64, KV_CACHE_DTYPES["bfloat16"]), tokens=1000,
                              layer_ids=range(3), device=META, views=views)
    # 1,001 rows x 3 layers x (K + V) x 2 heads x 64 x 2 B = 1,537,536 B (512-aligned); 800 B -> a 1,024 B slot
    assert pool.nbytes == 1_537_536 and arena.used == 1_537_536 + 1024
    assert list(pool.named_tensors()) == list(views) and all(pool.named_tensors()[n] is v for n, v in views.items())
    assert small.shape == (100,)


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 80, 96, 112, 128, 192, 256])
@pytest.mark.parametrize("kv_heads", [1, 3])
def test_fp4_plan_equals_allocation_for_every_head_dim(make_engine: Any, head_dim: int, kv_heads: int) -> None:
    model = tiny_model_config(head_dim=head_dim, num_key_value_heads=kv_heads, num_attention_heads=3 * kv_heads)
    result = configured(make_engine, model, device="meta", kv_cache_memory=32 * MiB, kv_cache_dtype="fp4_e2m1")
    plan = result.memory_pool_config
    # per layer and token: K and V, each kv_heads x (head_dim / 2 data + head_dim / 16 scale bytes)
    assert plan.bytes_per_token == 2 * 2 * kv_heads * (head_dim // 2 + head_dim // 16)
    assert result.token_to_kv_pool.nbytes == plan.pool("full").total_bytes  # the guard checked it too


@pytest.mark.parametrize("head_dim", [8, 24, 72])
def test_fp4_refuses_head_dims_it_cannot_pack(make_engine: Any, head_dim: int) -> None:
    model = tiny_model_config(head_dim=head_dim, num_key_value_heads=2, num_attention_heads=4)
    engine = make_engine(model=model, device="meta", kv_cache_memory=32 * MiB, kv_cache_dtype="fp4_e2m1",
                         probe=FixedMemoryProbe(total_bytes=GiB))
    with pytest.raises(ConfigError, match=f"{head_dim} elements cannot be stored as fp4_e2m1: .* multiple of 16"):
        engine.target.configurator().configure(pre_model_load_memory=GiB)


def test_a_dry_run_charges_the_kernels_that_load_with_the_weights_once(make_engine: Any) -> None:
    """H200 (measured): 150,109,880,320 B in all, 650,969,088 B of context before weights load, and
    96,468,992 B more once the first weights are filled; two workers' weights pay it once."""
    from kvcache.inputs.cards import card_named

    engine = make_engine(model="Llama-3.1-8B-Instruct", device="meta", card=card_named("H200"),
                         speculative_algorithm="EAGLE3", speculative_draft_model="EAGLE3-LLaMA3.1-Instruct-8B")
    runtime = engine.engine()
    runtime.bootstrap()
    budget = runtime.target.memory_pool_config.budget
    weights = runtime.target.weights.total_bytes + runtime.draft.weights.total_bytes
    assert budget.free_before_load_bytes == 150_109_880_320 - 650_969_088
    assert budget.free_after_load_bytes == budget.free_before_load_bytes - weights - 96_468_992


def test_a_simulated_card_charges_its_overhead_with_the_first_allocation_only() -> None:
    probe = FixedMemoryProbe(total_bytes=GiB, first_allocation_overhead=10 * MiB)
    probe.note_allocation(100 * MiB)
    probe.note_allocation(100 * MiB)
    assert probe.free_bytes() == GiB - 210 * MiB


def test_an_arena_that_cannot_be_allocated_is_a_build_error_with_nothing_held(make_engine: Any, monkeypatch: Any) -> None:
    from kvcache.errors import PoolBuildError

    asked: list[int] = []

    def out_of_memory(size: int, device: torch.device, *, zeroed: bool) -> torch.Tensor:
        asked.append(size)
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    engine = make_engine(kv_cache_memory=64 * MiB, probe=FixedMemoryProbe(total_bytes=GiB))
    configurator = engine.target.configurator()
    monkeypatch.setattr(device_buffers, "_flat", out_of_memory)
    with ArenaCensus().installed() as census, pytest.raises(PoolBuildError, match="failed part-way on cpu: CUDA out"):
        configurator.configure(pre_model_load_memory=GiB)
    assert len(asked) == 1 and asked[0] % (2 * MiB) == 0  # one request, the whole arena
    assert census.made == 0
