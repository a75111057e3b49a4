"""Pools: shapes and bytes from their specs, reads and writes per layer, formats, failure cleanup."""

from __future__ import annotations

import gc
import weakref

from typing import Any

import pytest
import torch

from kvcache.sizing.arena_sizes import allocation_size
from kvcache.inputs.dtypes import BFLOAT16, FLOAT32, KV_CACHE_DTYPES
from kvcache.sizing.layer_specs import FullAttentionSpec, MLASpec, RecurrentStateSpec
from kvcache.sizing.pool_config import request_table_slot
from kvcache.pools import MHATokenToKVPool, MLATokenToKVPool, RecurrentStatePool, ReqToTokenPool
from kvcache.memory import device_buffers as buffers
from kvcache.pools.codec import dequantize_fp4, quantize_fp4
from kvcache.testing.pool_plans import standalone_kv_pool, state_pool_plan

CPU = torch.device("cpu")
META = torch.device("meta")


def mha(dtype: str, device: torch.device = CPU, size: int = 32, page: int = 4) -> MHATokenToKVPool:
    pool = standalone_kv_pool(FullAttentionSpec(2, 16, 16, KV_CACHE_DTYPES[dtype]), tokens=size, page_size=page,
                              layer_ids=[3, 4], device=device)
    assert isinstance(pool, MHATokenToKVPool)
    return pool


@pytest.mark.parametrize(
    ("dtype", "bytes_per_token_per_layer"),
    [
        ("bfloat16", 2 * 2 * 16 * 2),  # K and V, 2 heads x 16, 2 bytes
        ("float32", 2 * 2 * 16 * 4),
        ("fp8_e4m3", 2 * 2 * 16 * 1),
        ("fp4_e2m1", 2 * (2 * 16 // 2 + 2 * 16 // 16)),  # half a byte per value + a scale byte per 16
    ],
)
@pytest.mark.parametrize("device", [CPU, META])
def test_mha_pool_bytes_match_the_spec_formula(dtype: str, bytes_per_token_per_layer: int, device: torch.device) -> None:
    pool = mha(dtype, device)
    rows = 32 + 4  # size + one padding page
    spec_bytes = KV_CACHE_DTYPES[dtype].bytes_for(2 * 16) * 2
    assert spec_bytes == bytes_per_token_per_layer
    # one allocation holds every layer's K and V (and FP4 scales), rounded once
    assert sum(KV_CACHE_DTYPES[dtype].row_buffers(2, 16)) * 2 == bytes_per_token_per_layer
    assert pool.nbytes == allocation_size(rows * bytes_per_token_per_layer * 2)


def test_mha_pool_writes_and_reads_per_layer() -> None:
    pool = mha("bfloat16")
    k = torch.randn(3, 2, 16, dtype=torch.bfloat16)
    v = torch.randn(3, 2, 16, dtype=torch.bfloat16)
    loc = torch.tensor([5, 6, 9])
    pool.set_kv_buffer(4, loc, k, v)
    assert torch.equal(pool.get_key_buffer(4)[loc], k)
    assert torch.equal(pool.get_value_buffer(4)[loc], v)
    assert pool.get_key_buffer(3).abs().sum() == 0  # other layers untouched, zero-initialised
    assert pool.get_key_buffer(4).shape == (36, 2, 16)
    with pytest.raises(KeyError, match="layer 7 is not in this pool"):
        pool.get_key_buffer(7)


def test_fp8_pool_stores_bytes_and_reads_as_fp8() -> None:
    pool = mha("fp8_e4m3")
    k = torch.tensor([0.5, -1.0, 2.0, 448.0] * 8).reshape(1, 2, 16).to(torch.bfloat16)
    pool.set_kv_buffer(3, torch.tensor([1]), k, k)
    assert pool._k[0].data.dtype == torch.uint8
    key = pool.get_key_buffer(3)
    assert key.dtype == torch.float8_e4m3fn
    assert torch.equal(key[1].float(), k[0].float())  # these values are exact in e4m3


def test_fp4_round_trip_is_exact_on_representable_values() -> None:
    # e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; amax 6 gives scale 1, which e4m3 holds exactly.
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0, 0.0])
    packed, scales = quantize_fp4(values.reshape(1, 16))
    assert packed.shape == (1, 8) and scales.shape == (1, 1)
    assert torch.equal(dequantize_fp4(packed, scales), values.reshape(1, 16))


def test_fp4_pool_holds_packed_data_and_scales() -> None:
    pool = mha("fp4_e2m1")
    k = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(0))
    pool.set_kv_buffer(3, torch.tensor([2, 3]), k, k)
    data, scales = pool.get_key_buffer(3), pool.get_key_scales(3)
    assert data.shape == (36, 2, 8) and scales is not None and scales.shape == (36, 2, 1)
    restored = dequantize_fp4(data[2:4], scales[2:4])
    # E2M1's grid is 0, .5, 1, 1.5, 2, 3, 4, 6 (times the group's scale): its widest step is 4 -> 6, so
    # rounding to nearest errs by at most 1 scale unit. The e4m3 scale (amax/6, 3 mantissa bits) may round
    # down by up to 1/16 (in its normal range, >= 2**-6, as for these N(0, 1) values), clamping the largest
    # value at 6 scale units: an error of at most 6/16 < 1 unit.
    # So every value is within one of its group's STORED scales (plus float32 rounding).
    unit = scales[2:4].view(torch.float8_e4m3fn).float()  # [2, 2, 1]: one scale per 16-value group
    assert bool(((restored - k).abs() <= unit * (1 + 1e-6)).all())


def test_mla_pool_latent_layout() -> None:
    pool = standalone_kv_pool(MLASpec(512, 64, KV_CACHE_DTYPES["bfloat16"]), tokens=8, layer_ids=range(3))
    assert isinstance(pool, MLATokenToKVPool)
    assert pool.nbytes == allocation_size(3 * 9 * (512 + 64) * 2)  # 3 layers x 9 rows x 576 x 2 B = 31,104
    assert pool.nbytes == 31232  # rounded up to a 512 B block
    nope = torch.randn(2, 1, 512, dtype=torch.bfloat16)
    rope = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    pool.set_mla_kv_buffer(1, torch.tensor([1, 2]), nope, rope)
    assert torch.equal(pool.get_value_buffer(1)[1:3], nope)
    assert torch.equal(pool.get_key_buffer(1)[1:3, :, 512:], rope)


@pytest.mark.parametrize(
    ("nbytes", "allocated"),
    [(1, 512), (512, 512), (513, 1024), (2**20, 2**20), (2**20 + 1, 2 * 2**20), (9 * 2**20, 10 * 2**20),
     (10 * 2**20 + 1, 12 * 2**20), (0, 0)],
)
def test_allocation_size_follows_the_cuda_caching_allocator(nbytes: int, allocated: int) -> None:
    # 512-byte blocks up to 1 MiB (the small pool); above it 2 MiB multiples, so no unsplit tail is counted
    assert allocation_size(nbytes) == allocated


def test_req_to_token_pool_rows_and_padding_row() -> None:
    pool = ReqToTokenPool(slot=request_table_slot(3, 10, with_state_slots=True), device=CPU)
    assert pool.nbytes == 512  # (3 + 1) rows x 10 x int32 = 160 B plus a 16 B slot column: one 512 B block
    rows = pool.alloc(3)
    assert rows is not None and sorted(rows) == [1, 2, 3]  # row 0 is padding
    assert pool.alloc(1) is None
    pool.free(rows[0])
    assert pool.available_size() == 1
    with pytest.raises(ValueError, match="request row 0 is not in 1..3"):
        pool.free(0)


def test_state_pool_bytes_and_slots() -> None:
    spec = RecurrentStateSpec(kind="mamba2", conv_shape=(8, 3), ssm_shape=(2, 4, 4),
                              conv_dtype=BFLOAT16, ssm_dtype=FLOAT32)
    pool = RecurrentStatePool(plan=state_pool_plan(spec, num_slots=5, layer_ids=[0, 2]), device=CPU)
    assert spec.bytes_per_request == 8 * 3 * 2 + 2 * 4 * 4 * 4
    assert pool.nbytes == allocation_size(2 * 5 * spec.bytes_per_request)
    slots = pool.alloc(4)
    assert slots is not None and 0 not in slots and pool.alloc(1) is None


def test_state_pool_refuses_a_double_free_so_no_two_requests_share_a_state() -> None:
    spec = RecurrentStateSpec(kind="mamba2", conv_shape=(8, 3), ssm_shape=(2, 4, 4),
                              conv_dtype=BFLOAT16, ssm_dtype=FLOAT32)
    pool = RecurrentStatePool(plan=state_pool_plan(spec, num_slots=5), device=CPU)  # slots 1..4
    assert pool.alloc(2) == [1, 2]
    pool.free([1])
    with pytest.raises(ValueError, match="double free: state slot 1 is already free"):
        pool.free([1])  # it was taken back silently: slot 1 went to the next two requests
    with pytest.raises(ValueError, match=r"freed twice in one call: \[2, 2\]"):
        pool.free([2, 2])
    with pytest.raises(ValueError, match="negative"):
        pool.alloc(-1)
    assert pool.available_size() == 3
    slots = pool.alloc(3)
    assert slots is not None and sorted(slots) == [1, 3, 4] and pool.alloc(1) is None  # every free slot once


def test_a_pool_that_fails_part_way_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[weakref.ref[torch.Tensor]] = []
    real = buffers.Arena.carve_slot

    def fail_on_second(arena: buffers.Arena, parts: Any) -> list[torch.Tensor]:
        if len(made) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated on the second buffer)")
        views = real(arena, parts)
        made.append(weakref.ref(views[0]))
        return views

    monkeypatch.setattr(buffers.Arena, "carve_slot", fail_on_second)
    pools = []
    try:
        for _ in range(2):
            pools.append(standalone_kv_pool(FullAttentionSpec(1, 16, 16, KV_CACHE_DTYPES["bfloat16"]), tokens=8,
                                            layer_ids=range(4)))
    except torch.OutOfMemoryError:
        pools.clear()
    else:
        pytest.fail("the second allocation should have failed")
    gc.collect()
    assert len(made) == 1 and all(ref() is None for ref in made)


def test_one_allocation_per_pool() -> None:
    pool = mha("bfloat16")
    storages = {t.untyped_storage().data_ptr() for t in pool.named_tensors().values()}
    assert len(storages) == 1
