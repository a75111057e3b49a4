"""The plan lists every tensor a worker builds (name, shape, dtype, bytes), and the builder builds exactly that list.

For every corpus config on the meta device and every preset on the CPU (small budgets), one worker is planned
and built: the plan's tensor list and the built tensors are walked name by name, the plan's buffer bytes are
the sums of its arena slots, and the slots fill the arena the builder allocated.
"""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcache.byte_units import GiB, MiB
from kvcache.engines import engine_rules
from kvcache.inputs.dtypes import KV_CACHE_DTYPES, resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.sizing.arena_sizes import arena_size
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.hf_config import model_config_from_hf
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import load_model_config, preset_names
from kvcache.pools.builder import build_worker_pools
from kvcache.allocators.factory import allocator_for_plan
from kvcache.sizing.layer_specs import FullAttentionSpec, MLASpec
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.memory.torch_dtypes import dtype_name
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory

CORPUS = Path(__file__).with_name("model_corpus")
REFUSED = {"DeepSeek-V4-Flash", "gemma-4-26B-A4B"}  # caches this engine does not model (test_model_corpus)
CORPUS_NAMES = sorted(p.stem for p in CORPUS.glob("*.json") if p.stem not in REFUSED)


def planned_and_built(model: ModelConfig, device: str, budget: int, *, context: int = 4096, tp: int = 1,
                      kv: str = "auto", **settings: object) -> tuple[MemoryPoolConfig, dict[str, torch.Tensor], int]:
    """One worker's plan, the tensors the builder built for it by name, and the bytes its arena holds."""
    model_dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    sizing = WorkerSizing(
        settings=SizingSettings(kv_cache_memory=budget, context_length=min(context, model.max_position_embeddings),
                                **settings),  # type: ignore[arg-type]
        model_config=model, parallel_state=ParallelState(tp_size=tp), model_dtype=model_dtype,
        kv_cache_dtype=resolve_kv_cache_dtype(kv, model_dtype), device_type=device,
        engine=engine_rules("sglang"),
    )
    plan = sizing.plan(WorkerMemory(total_bytes=4000 * GiB, free_before_load=4000 * GiB, free_after_load=4000 * GiB))
    pools = build_worker_pools(plan=plan, layout=sizing.layout(), device=torch.device(device),
                               allocator_factory=allocator_for_plan)
    return plan, pools.named_tensors(), pools.arena.used


def assert_built_as_planned(plan: MemoryPoolConfig, built: dict[str, torch.Tensor], arena_used: int) -> None:
    planned = plan.tensors()
    assert list(built) == [t.name for t in planned]  # the same names, in arena order
    for t in planned:
        tensor = built[t.name]
        assert (tuple(tensor.shape), dtype_name(tensor.dtype)) == (t.shape, t.dtype), t.name
        assert tensor.numel() * tensor.element_size() == t.nbytes == prod(t.shape) * tensor.element_size()
    slots = plan.worker_slots()
    sums: dict[str, int] = {}
    for s in slots:
        sums[s.buffer] = sums.get(s.buffer, 0) + s.nbytes
    assert sums == plan.worker_buffers()  # the plan's bytes are the sums of its tensor list
    assert arena_used == sum(s.nbytes for s in slots) and plan.arena_bytes() == arena_size(arena_used)
    if next(iter(built.values())).device.type != "meta":  # every tensor a view of the one arena, in planned order
        storages = {t.untyped_storage().data_ptr() for t in built.values()}
        starts = [t.data_ptr() for t in built.values()]
        assert len(storages) == 1 and starts == sorted(starts)


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_every_corpus_config_builds_its_planned_tensors_on_meta(name: str) -> None:
    model = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    assert_built_as_planned(*planned_and_built(model, "meta", 8 * GiB))


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_its_planned_tensors_on_the_cpu(name: str) -> None:
    # Nemotron-H's state takes 0.85 GiB per slot on one rank, 0.11 GiB at TP 8; Mamba-Codestral's 0.25, 0.03 at TP 8
    tp, budget = (8, 512 * MiB) if name in ("Nemotron-H-56B-Base-8K", "Mamba-Codestral-7B-v0.1") else (1, 256 * MiB)
    assert_built_as_planned(*planned_and_built(load_model_config(name), "cpu", budget, context=256, tp=tp,
                                               max_running_requests=1, max_mamba_cache_size=1,
                                               disable_radix_cache=True))  # one state slot per request


@pytest.mark.parametrize(("name", "kv", "expected"), [
    ("DeepSeek-V3.2", "fp8_e4m3", {"kv_mla.0.latent": ((1, 656), "uint8"), "kv_mla.0.index_k": ((132,), "uint8")}),
    ("gpt-oss-120b", "auto", {"allocator.full_to_swa": None, "allocator.swa.free_log.0": None}),
    ("Qwen3-0.6B", "fp4_e2m1", {"kv_full.0.k": ((8, 64), "uint8"), "kv_full.0.k_scales": ((8, 8), "uint8")}),
])
def test_packed_latents_scales_and_swa_maps_are_carved_as_planned(
        name: str, kv: str, expected: dict[str, tuple[tuple[int, ...], str] | None]) -> None:
    """The layouts beside plain K/V: DSA's packed fp8 latent and indexer keys, FP4's scale bytes, an SWA pair's
    second free list and full -> SWA map (shapes per row: a token's tensors in one layer)."""
    plan, built, used = planned_and_built(model_config_from_hf(CORPUS / f"{name}.json", name=name), "meta", 8 * GiB,
                                          kv=kv)
    assert_built_as_planned(plan, built, used)
    for tensor_name, row in expected.items():
        if row is not None:
            assert (tuple(built[tensor_name].shape[1:]), dtype_name(built[tensor_name].dtype)) == row, tensor_name
        else:
            assert tensor_name in built


def test_a_draft_worker_builds_its_own_planned_tensors_and_shares_the_targets_table_and_allocator(
        make_engine: Any) -> None:
    engine = make_engine(device="meta", kv_cache_memory=2 * GiB, speculative_algorithm="EAGLE3",
                         speculative_draft_model="EAGLE3-LLaMA3.1-Instruct-8B",
                         model=load_model_config("Llama-3.1-8B-Instruct"), context_length=4096,
                         probe=FixedMemoryProbe(total_bytes=80 * GiB))
    runtime = engine.engine()
    runtime.bootstrap()
    plan, target, draft = runtime.target.memory_pool_config, runtime.target.kv_cache, runtime.draft.kv_cache
    drafted = draft.token_to_kv_pool.named_tensors()
    assert [(n, tuple(t.shape), dtype_name(t.dtype)) for n, t in drafted.items()] == [
        (t.name, t.shape, t.dtype) for t in plan.tensors(draft=True)]
    assert list(drafted)[:2] == ["kv_draft_full.0.k", "kv_draft_full.0.v"]
    assert draft.req_to_token_pool is target.req_to_token_pool
    assert draft.token_to_kv_pool_allocator is target.token_to_kv_pool_allocator


def test_the_tensor_list_of_a_gqa_layer_is_k_then_v_per_layer() -> None:
    """Llama-3.1-8B: 8 KV heads of 128 per layer in bfloat16; every layer's K then V, rows = tokens + one page."""
    plan, built, _ = planned_and_built(load_model_config("Llama-3.1-8B-Instruct"), "meta", 1 * GiB, page_size=16)
    rows = plan.max_total_num_tokens + 16
    kv = [t for t in plan.tensors() if t.name.startswith("kv_full.")]
    assert [t.name for t in kv[:4]] == ["kv_full.0.k", "kv_full.0.v", "kv_full.1.k", "kv_full.1.v"] and len(kv) == 64
    assert {(t.shape, t.dtype, t.nbytes) for t in kv} == {((rows, 8, 128), "bfloat16", rows * 8 * 128 * 2)}
    assert plan.pool("full").bytes_per_token == 32 * 2 * 8 * 128 * 2  # 131,072 B: the pinned per-token cost


def test_fp4_and_a_sparse_indexer_are_listed_with_their_scales() -> None:
    fp4 = FullAttentionSpec(8, 128, 128, KV_CACHE_DTYPES["fp4_e2m1"]).row_tensors()
    assert [(t.name, t.shape, t.dtype) for t in fp4] == [
        ("k", (8, 64), "uint8"), ("k_scales", (8, 8), "uint8"), ("v", (8, 64), "uint8"), ("v_scales", (8, 8), "uint8")]
    dsa = MLASpec(512, 64, KV_CACHE_DTYPES["fp8_e4m3"], index_head_dim=128).row_tensors()
    # packed latent: 512 fp8 + 512/128 float32 scales + 64 bfloat16 = 656 B; indexer key: 128 fp8 + 1 float32 scale
    assert [(t.name, t.shape, t.dtype) for t in dsa] == [("latent", (1, 656), "uint8"), ("index_k", (132,), "uint8")]


def test_a_hybrid_lists_its_state_and_the_request_tables_state_column() -> None:
    plan, built, _ = planned_and_built(load_model_config("Qwen3-Next-80B-A3B-Thinking"), "meta", 4 * GiB)
    names = [t.name for t in plan.tensors()]
    assert names[:2] == ["req_to_token.table", "req_to_token.state_slot"]
    assert names[2:4] == ["allocator.free_log.0", "allocator.free_log.1"]
    state = [t for t in plan.tensors() if t.name.startswith("state.")]
    assert len(state) == 2 * 36 and state[0].name == "state.0.ssm" and state[1].name == "state.0.conv"
    assert state[1].shape[-1] == 3  # linear_conv_kernel_dim 4: the conv state keeps kernel - 1 columns
