"""Pools and allocators take the views they are given: built from plain tensors (no arena) they hold exactly
those, and a view of another shape, dtype or device, or a missing one, is refused naming it and the plan's."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
import torch

from kvcache.byte_units import GiB, MiB
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.memory.vmm_storage import VmmBacking
from kvcache.testing.virtual_memory import FakeVirtualMemory
from kvcache.allocators import SWATokenToKVPoolAllocator
from kvcache.errors import PlanMismatchError
from kvcache.inputs.dtypes import BFLOAT16, FLOAT32, KV_CACHE_DTYPES
from kvcache.memory.device_buffers import Arena
from kvcache.pools import MHATokenToKVPool, MLATokenToKVPool, RecurrentStatePool, ReqToTokenPool
from kvcache.pools.planned_views import carve_slots
from kvcache.sizing.allocator_footprint import allocator_slots, free_list_slots
from kvcache.sizing.layer_specs import FullAttentionSpec, MLASpec, RecurrentStateSpec
from kvcache.sizing.pool_config import request_table_slot
from kvcache.memory.torch_dtypes import torch_dtype
from kvcache.sizing.tensor_plan import PlannedSlot, per_layer, tensor
from kvcache.testing.pool_plans import kv_pool_plan, standalone_kv_pool, state_pool_plan
from kvcache.testing.allocator_plans import paged_allocator, swa_allocator, token_allocator

CPU = torch.device("cpu")
BF16 = KV_CACHE_DTYPES["bfloat16"]


def plain(slots: tuple[PlannedSlot, ...] | list[PlannedSlot]) -> dict[str, torch.Tensor]:
    """One zeroed tensor of its own per planned tensor: views that come from no arena."""
    return {t.name: torch.zeros(t.shape, dtype=torch_dtype(t.dtype)) for s in slots for t in s.tensors}


def kv_slot(rows: int, layers: tuple[int, ...] = (0, 1)) -> PlannedSlot:
    return PlannedSlot("kv_full", per_layer("kv_full", layers, FullAttentionSpec(2, 64, 64, BF16).row_tensors(), rows))


def mha(views: dict[str, torch.Tensor]) -> MHATokenToKVPool:
    spec = FullAttentionSpec(2, 64, 64, BF16)
    return MHATokenToKVPool(plan=kv_pool_plan(spec, tokens=8, layer_ids=(0, 1)), spec=spec, device=CPU, views=views)


def test_an_mha_pool_built_from_plain_tensors_holds_and_writes_exactly_them() -> None:
    views = plain([kv_slot(9)])  # 8 tokens + the padding row
    pool = mha(views)
    assert list(pool.named_tensors()) == ["kv_full.0.k", "kv_full.0.v", "kv_full.1.k", "kv_full.1.v"]
    assert all(pool.named_tensors()[name] is t for name, t in views.items())
    pool.set_kv_buffer(1, torch.tensor([3]), torch.ones(1, 2, 64), torch.full((1, 2, 64), 2.0))
    assert views["kv_full.1.k"][3].eq(1).all() and views["kv_full.1.v"][3].eq(2).all()
    assert views["kv_full.0.k"].eq(0).all()  # the other layer is untouched
    # each layer: 9 rows x (K + V) x 2 heads x 64 x 2 B = 4,608 B; two layers 9,216 B, a 512 B multiple already
    assert pool.get_kv_size_bytes() == (4_608, 4_608) and pool.nbytes == 9_216


def test_the_other_pools_and_every_allocator_take_plain_tensors() -> None:
    table = plain([request_table_slot(4, 16, True)])
    req = ReqToTokenPool(slot=request_table_slot(4, 16, True), device=CPU, views=table)
    assert req.req_to_token is table["req_to_token.table"] and req.req_to_state_slot is table["req_to_token.state_slot"]

    spec = RecurrentStateSpec(kind="mamba2", conv_shape=(32, 3), ssm_shape=(2, 8, 16), conv_dtype=BFLOAT16,
                              ssm_dtype=FLOAT32)
    state_views = plain([PlannedSlot("state", per_layer("state", (1, 3), spec.slot_tensors(), 5))])
    state = RecurrentStatePool(plan=state_pool_plan(spec, num_slots=5, layer_ids=(1, 3)), device=CPU, views=state_views)
    assert state.get_state(3) == (state_views["state.3.conv"], state_views["state.3.ssm"])

    mla_views = {"kv_mla.0.latent": torch.zeros(9, 1, 576, dtype=torch.bfloat16)}
    mla = standalone_kv_pool(MLASpec(512, 64, BF16), tokens=8, views=mla_views)
    assert mla.get_key_buffer(0) is mla_views["kv_mla.0.latent"]

    for allocator, slots in [
        (lambda v: token_allocator(size=8, device=CPU, views=v), free_list_slots(8, 1)),
        (lambda v: paged_allocator(size=64, page_size=16, device=CPU, kernels=None, views=v),
         free_list_slots(64, 16)),
        (lambda v: swa_allocator(full_size=64, swa_size=32, page_size=16, device=CPU, views=v),
         allocator_slots(64, 16, 32)),
    ]:
        views = plain(slots)
        a = allocator(views)
        assert a.named_tensors().keys() == views.keys()
        assert all(a.named_tensors()[name] is t for name, t in views.items())
        out = a.alloc(a.page_size)
        assert out is not None and out.numel() == a.page_size
        a.free(out)
        assert a.available_size() == a.size


def test_one_pass_carves_each_slot_back_to_back_and_the_pools_hold_those_views() -> None:
    slots = (request_table_slot(4, 16, False), *free_list_slots(8, 1), kv_slot(9))
    arena = Arena(sum(s.nbytes for s in slots), CPU)
    views = carve_slots(arena, slots)
    # 5 x 16 int32 = 320 B -> a 512 B slot; each log 16 int64 = 128 B -> 512 B; K/V 9,216 B
    assert arena.used == arena.nbytes == 512 + 2 * 512 + 9_216
    base = views["req_to_token.table"].data_ptr()
    assert [views[n].data_ptr() - base for n in ("allocator.free_log.0", "allocator.free_log.1", "kv_full.0.k",
                                                 "kv_full.0.v", "kv_full.1.k")] == [512, 1024, 1536, 3840, 6144]
    req = ReqToTokenPool(slot=request_table_slot(4, 16), device=CPU, views=views)
    allocator = token_allocator(size=8, device=CPU, views=views, kvcache=mha(views))
    assert req.named_tensors()["req_to_token.table"] is views["req_to_token.table"]
    assert allocator.named_tensors()["allocator.free_log.1"] is views["allocator.free_log.1"]


@pytest.mark.parametrize(("name", "bad", "message"), [
    ("kv_full.1.v", torch.zeros(8, 2, 64, dtype=torch.bfloat16),
     "the view given for 'kv_full.1.v' is (8, 2, 64) bfloat16 on cpu; the plan has (9, 2, 64) bfloat16 on cpu"),
    ("kv_full.0.k", torch.zeros(9, 2, 64, dtype=torch.float16),
     "the view given for 'kv_full.0.k' is (9, 2, 64) float16 on cpu; the plan has (9, 2, 64) bfloat16 on cpu"),
    ("kv_full.0.k", torch.zeros(9, 2, 64, dtype=torch.bfloat16, device="meta"),
     "the view given for 'kv_full.0.k' is (9, 2, 64) bfloat16 on meta; the plan has (9, 2, 64) bfloat16 on cpu"),
    ("kv_full.1.k", None, "no view was given for 'kv_full.1.k'; the plan has (9, 2, 64) bfloat16 on cpu"),
])
def test_a_view_of_another_shape_dtype_or_device_or_none_is_refused_by_name(
        name: str, bad: torch.Tensor | None, message: str) -> None:
    views = plain([kv_slot(9)])
    if bad is None:
        del views[name]
    else:
        views[name] = bad
    with pytest.raises(PlanMismatchError) as refused:
        mha(views)
    assert str(refused.value) == message


def test_a_kv_pool_refuses_a_spec_that_is_not_the_one_its_planned_row_came_from() -> None:
    """The pool reads its encoding and head widths from the spec and its tensors from the plan: an FP4 spec over a
    bfloat16 plan (2 heads of 64: FP4 packs 32 bytes and 4 scale bytes a head) would write the wrong bytes."""
    plan = kv_pool_plan(FullAttentionSpec(2, 64, 64, BF16), tokens=8)
    with pytest.raises(PlanMismatchError) as refused:
        MHATokenToKVPool(plan=plan, spec=FullAttentionSpec(2, 64, 64, KV_CACHE_DTYPES["fp4_e2m1"]), device=CPU)
    assert str(refused.value) == ("the spec given for 'kv_full' stores a token as k (2, 32) uint8, k_scales (2, 4) "
                                  "uint8, v (2, 32) uint8, v_scales (2, 4) uint8; the plan has k (2, 64) bfloat16, "
                                  "v (2, 64) bfloat16")
    bytes_alone = msgspec.structs.replace(kv_pool_plan(MLASpec(512, 64, BF16), tokens=8), row=())  # by hand
    with pytest.raises(PlanMismatchError, match=r"'kv_mla' stores a token as latent \(1, 576\) bfloat16; the plan "
                                                r"has nothing"):
        MLATokenToKVPool(plan=bytes_alone, spec=MLASpec(512, 64, BF16), device=CPU)


def test_an_allocator_refuses_free_logs_sized_for_another_capacity() -> None:
    views = plain(free_list_slots(16, 1))  # logs of 32 ids for an allocator of 8 tokens
    with pytest.raises(PlanMismatchError, match=r"'allocator.free_log.0' is \(32,\) int64 on cpu; the plan has "
                                                r"\(16,\) int64 on cpu"):
        token_allocator(size=8, device=CPU, views=views)


def test_an_swa_allocator_reads_both_sizes_from_its_slots_and_refuses_a_map_or_a_side_they_do_not_agree_on() -> None:
    """The full -> SWA map has a row per full-pool row (64 tokens + a page of 16) and the -1 row: 81 int64."""
    slots = allocator_slots(64, 16, 32)
    a = SWATokenToKVPoolAllocator(slots=slots, page_size=16, device=CPU)
    assert (a.size_full, a.size_swa, a.full_to_swa_index_mapping.shape) == (64, 32, (81,))
    other_map = (*slots[:-1], allocator_slots(128, 16, 32)[-1])  # a map planned for 128 full tokens
    with pytest.raises(PlanMismatchError, match=r"the full -> SWA map is planned as \[\(145,\)\]; the full side's 64 "
                                                r"tokens in pages of 16 need \(81,\)"):
        SWATokenToKVPoolAllocator(slots=other_map, page_size=16, device=CPU)
    with pytest.raises(PlanMismatchError, match=r"two free lists \(\*\.full\.\* and \*\.swa\.\*\) and the full -> SWA map; "
                                                r"given allocator.full.free_log.0, allocator.full.free_log.1, "
                                                r"allocator.full_to_swa$"):
        SWATokenToKVPoolAllocator(slots=(*slots[:2], slots[-1]), page_size=16, device=CPU)


def test_an_allocator_asked_to_check_frees_on_the_builders_views_finds_no_flags_there() -> None:
    """The worker's arena plans no is_free flags (MemoryPoolConfig.worker_slots): an allocator that checks frees
    carves its own lists, and one given the builder's views is refused by name."""
    views = plain(free_list_slots(8, 1))
    with pytest.raises(PlanMismatchError, match=r"no view was given for 'allocator.is_free'; the plan has \(9,\) bool"):
        token_allocator(size=8, check_frees=True, views=views)


def test_a_worker_given_an_arena_backing_carves_every_tensor_from_that_storage(make_engine: Any) -> None:
    """The VMM path of a post-capture resize, on the CPU fake of the driver: the configurator's arena_backing is
    passed to the builder explicitly (no ambient context), and its one allocation holds every tensor."""
    engine = make_engine(kv_cache_memory=16 * MiB, probe=FixedMemoryProbe(total_bytes=GiB))
    memory = FakeVirtualMemory(granularity=4096)
    backing = VmmBacking(chunk_bytes=1 << 20, memory=lambda device: memory)
    configurator = dataclasses.replace(engine.target.configurator(), arena_backing=backing)
    result = configurator.configure(pre_model_load_memory=GiB)
    (allocation,) = backing.allocations
    plan = result.memory_pool_config
    assert allocation.reserved >= plan.arena_bytes() == result.allocated_bytes == memory.physical_bytes
    tensors = [*result.req_to_token_pool.named_tensors().values(),
               *result.token_to_kv_pool_allocator.named_tensors().values(),
               *result.token_to_kv_pool.named_tensors().values()]
    assert len(tensors) == len(plan.tensors())
    assert all(allocation.base <= t.data_ptr() < allocation.base + plan.arena_bytes() for t in tensors)


def test_a_tensor_of_no_elements_takes_no_bytes_and_moves_no_other_view() -> None:
    """What a conv kernel of 1 would have planned (kernel - 1 = 0 columns; such configs are refused before, exit 2):
    carved by the list, it is an empty view at its place and every other view lands where the plan says."""
    slots = (PlannedSlot("state", (tensor("state.0.ssm", (3, 4), "float32"), tensor("state.0.conv", (3, 8, 0), "bfloat16"),
                                   tensor("state.1.ssm", (3, 4), "float32"))), *free_list_slots(8, 1))
    arena = Arena(sum(s.nbytes for s in slots), CPU)
    views = carve_slots(arena, slots)
    assert views["state.0.conv"].numel() == 0 and arena.used == 512 + 512 + 512
    assert views["state.1.ssm"].data_ptr() - views["state.0.ssm"].data_ptr() == 48
    assert views["allocator.free_log.0"].data_ptr() - views["state.0.ssm"].data_ptr() == 512


def test_an_mla_pool_reports_its_tensors_bytes_as_sglang_does_not_its_slots_padding() -> None:
    """DeepSeek-V2's latent, 512 + 64 bf16 = 1,152 B a row; 5 tokens + the padding row = 6,912 B in a 7,168 B slot.
    A DSA indexer adds 128 fp8 B and one float32 scale a row: 6 x 1,284 = 7,704 B (SGLang's DSA pool adds them too)."""
    from kvcache.inputs.dtypes import KV_CACHE_DTYPES
    from kvcache.sizing.layer_specs import MLASpec
    from kvcache.testing.pool_plans import standalone_kv_pool

    latent = standalone_kv_pool(MLASpec(512, 64, KV_CACHE_DTYPES["bfloat16"]), tokens=5)
    assert (latent.get_kv_size_bytes(), latent.nbytes) == (6_912, 7_168)
    dsa = standalone_kv_pool(MLASpec(512, 64, KV_CACHE_DTYPES["bfloat16"], index_head_dim=128), tokens=5)
    assert (dsa.get_kv_size_bytes(), dsa.nbytes) == (7_704, 8_192)
    # FP4: 576 half-byte entries = 288 B a row, 1,728 B; SGLang's FP4 pool leaves the scales out of its number
    fp4 = standalone_kv_pool(MLASpec(512, 64, KV_CACHE_DTYPES["fp4_e2m1"]), tokens=5)
    assert (fp4.get_kv_size_bytes(), fp4.nbytes) == (1_728, 2_048)
