"""Applying a resize on CPU: the new allocator keeps exactly the tokens in use; live tokens in the tail refuse it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvcache.inputs.dtypes import KV_CACHE_DTYPES
from kvcache.sizing.layer_specs import FullAttentionSpec, MLASpec
from kvcache.testing.pool_plans import standalone_kv_pool
from kvcache.errors import VmmError
from kvcache.runtime.shrink import (
    CARRY_CHUNK_TOKENS, LiveTokensInTailError, carry_tokens_in_use, carry_transient_bytes, complement, pool_buffers, released_address_ranges,
)
from kvcache.testing.allocator_plans import paged_allocator, token_allocator

CPU = torch.device("cpu")


def _allocator(size: int, page: int):  # type: ignore[no-untyped-def]
    if page == 1:
        return token_allocator(size=size, device=CPU, check_frees=True)
    return paged_allocator(size=size, page_size=page, device=CPU, check_frees=True)


@pytest.mark.parametrize("chunk", [CARRY_CHUNK_TOKENS, 1, 48], ids=["one-chunk", "page-by-page", "3-pages-of-16"])
@pytest.mark.parametrize("page", [1, 16])
def test_the_smaller_allocator_keeps_the_tokens_in_use_and_frees_the_rest(page, chunk):
    old = _allocator(64 * page, page)
    held = old.alloc(8 * page)  # the first 8 pages of a fresh allocator
    swap = carry_tokens_in_use(old, _allocator(32 * page, page), chunk_tokens=chunk)
    smaller = swap.allocator
    assert old.available_size() == 0  # drained until the resize commits or is undone
    assert smaller.size == 32 * page and smaller.available_size() == 24 * page
    rest = smaller.alloc(24 * page)
    assert set(rest.tolist()).isdisjoint(held.tolist())
    assert max(rest.tolist()) < 33 * page  # pages 1..32 only
    assert smaller.alloc(page) is None
    smaller.free(held)  # what was in use is in use in the new allocator, so it can be freed once
    assert smaller.available_size() == 8 * page
    swap.undo()
    assert old.available_size() == 56 * page


@pytest.mark.parametrize("chunk", [CARRY_CHUNK_TOKENS, 1, 48], ids=["one-chunk", "page-by-page", "3-pages-of-16"])
@pytest.mark.parametrize("page", [1, 16])
def test_a_larger_allocator_keeps_the_tokens_in_use_and_frees_the_rest_and_every_grown_page(page, chunk):
    old = _allocator(32 * page, page)
    held = old.alloc(8 * page)
    larger = carry_tokens_in_use(old, _allocator(64 * page, page), chunk_tokens=chunk).allocator
    assert old.available_size() == 0 and larger.available_size() == 56 * page
    rest = larger.alloc(56 * page)
    assert sorted(rest.tolist() + held.tolist()) == list(range(page, 65 * page))  # pages 1..64, each once
    larger.free(held)
    assert larger.available_size() == 8 * page


@pytest.mark.parametrize("chunk", [CARRY_CHUNK_TOKENS, 1], ids=["one-chunk", "page-by-page"])
@pytest.mark.parametrize("page", [1, 16])
def test_live_tokens_in_the_tail_refuse_the_resize_and_change_nothing(page, chunk):
    old = _allocator(64 * page, page)
    old.alloc(40 * page)  # pages 1..40: pages 33..40 would be cut off
    with pytest.raises(LiveTokensInTailError, match=f"{8 * page} KV tokens in use lie past token {32 * page}"):
        carry_tokens_in_use(old, _allocator(32 * page, page), chunk_tokens=chunk)
    assert old.available_size() == 24 * page and old.size == 64 * page


@pytest.mark.parametrize("page", [1, 16])
def test_a_new_allocator_with_tokens_in_use_is_refused_and_the_old_one_keeps_its_free_tokens(page):
    old = _allocator(64 * page, page)
    old.alloc(8 * page)
    used = _allocator(32 * page, page)
    used.alloc(page)
    with pytest.raises(ValueError, match=f"the new allocator has {page} tokens in use; it must be fresh"):
        carry_tokens_in_use(old, used)
    assert old.available_size() == 56 * page


def test_each_pool_buffer_keeps_its_first_rows():
    fp8 = KV_CACHE_DTYPES["fp8_e4m3"]
    mha = standalone_kv_pool(FullAttentionSpec(2, 8, 8, fp8), tokens=64, page_size=16, layer_ids=range(3))
    buffers = pool_buffers(mha)
    assert len(buffers) == 6  # K and V of three layers
    ranges = released_address_ranges(buffers, 16 + 16)
    assert [e - s for s, e in ranges] == [(80 - 32) * 2 * 8] * 6  # rows 32..79 of 2 heads x 8 one-byte values
    assert ranges[1][0] == buffers[1].data_ptr() + 32 * 16
    assert complement([(10, 20), (30, 40)], 0, 50) == [(0, 10), (20, 30), (40, 50)]
    assert complement([(0, 20), (15, 50)], 0, 50) == []
    mla = standalone_kv_pool(MLASpec(32, 16, KV_CACHE_DTYPES["fp4_e2m1"]), tokens=64, layer_ids=range(2))
    assert [t.shape[-1] for t in pool_buffers(mla)] == [24, 3, 24, 3]  # packed data and per-16 scales


class FakeAllocation:
    """Stands in for a VmmAllocation over a CPU pool's one storage: records what it is told to map and keep."""

    granularity = 4096

    def __init__(self, storage: torch.UntypedStorage, fails: bool = False, remap_fails: bool = False) -> None:
        self.base, self.reserved = storage.data_ptr(), storage.nbytes()
        self.mapped_ranges: list[tuple[int, int]] = [(0, self.reserved)]
        self.kept: list[tuple[int, int]] = []
        self.fails = fails
        self.remap_fails = remap_fails
        self.released = 0
        self.calls: list[str] = []

    def keep_only(self, ranges):  # type: ignore[no-untyped-def]
        self.calls.append("keep_only")
        if self.fails:  # a VmmAllocation that fails maps everything again itself (unless that fails too)
            if self.remap_fails:
                self.mapped_ranges, self.released = list(ranges), self.reserved - sum(e - s for s, e in ranges)
                raise VmmError("cuMemCreate failed: out of memory (injected, mapping back)")
            raise VmmError("cuMemCreate failed: out of memory (injected)")
        self.kept = self.mapped_ranges = list(ranges)
        self.released = self.reserved - sum(e - s for s, e in ranges)
        return self.released

    def map_within(self, ranges) -> int:  # type: ignore[no-untyped-def]
        self.calls.append("map_within")
        if self.remap_fails:
            raise VmmError("cuMemCreate failed: out of memory (injected, mapping back)")
        assert ranges == [(0, self.reserved)]  # what the resize maps back: all of it, as it was
        mapped, self.released, self.kept, self.mapped_ranges = self.released, 0, [], [(0, self.reserved)]
        return mapped


class FakeBacking:
    granularity = FakeAllocation.granularity

    def __init__(self, pool, fails: bool = False, remap_fails: bool = False) -> None:  # type: ignore[no-untyped-def]
        self.allocation = FakeAllocation(pool_buffers(pool)[0].untyped_storage(), fails, remap_fails)

    def allocation_at(self, address: int) -> FakeAllocation:
        assert self.allocation.base <= address < self.allocation.base + self.allocation.reserved
        return self.allocation


def _runner_after_capture(make_engine):  # type: ignore[no-untyped-def]
    """A tiny page-16 runner holding 64 tokens, with 40 MiB free after "capture" (under the 512 MiB headroom)."""
    from kvcache.testing import FixedMemoryProbe, tiny_model_config

    engine = make_engine(model=tiny_model_config(), mem_fraction_static=0.5, memory_limit=1 << 30, page_size=16,
                         max_running_requests=8)
    probe = FixedMemoryProbe(total_bytes=1 << 30)
    engine.memory_probe.override(probe)
    runner = engine.engine().target
    runner.initialize()
    held = runner.token_to_kv_pool_allocator.alloc(64)
    probe.note_allocation(probe.free_bytes() - 40 * 1024 * 1024)
    return engine, runner, probe, held


def _apply(engine, runner, probe, backing):  # type: ignore[no-untyped-def]
    from app.forward.post_capture import apply_post_capture_resize
    from kvcache.inputs.sizing_settings import SizingSettings

    return apply_post_capture_resize(
        kv_cache=runner.kv_cache, backing=backing, settings=SizingSettings.from_server_args(engine.server_args()),
        parallel_state=runner.parallel_state, memory_probe=probe, pre_model_load_memory=runner.pre_model_load_memory,
        captured_max_bs=8, allocator_factory=runner._configurator_factory().allocator_factory)


def test_applying_a_resize_shrinks_the_allocator_and_keeps_each_buffers_first_rows(make_engine):
    engine, runner, probe, held = _runner_after_capture(make_engine)
    kv = runner.kv_cache
    before = kv.memory_pool_config
    backing = FakeBacking(kv.token_to_kv_pool)
    resize, allocator, released = _apply(engine, runner, probe, backing)
    headroom = (1 << 30) // 2  # what mem_fraction_static 0.5 keeps back of the 1 GiB free before load
    assert resize.headroom_bytes == headroom and resize.changed
    assert resize.after.total_bytes <= before.total_bytes + 40 * 1024 * 1024 - headroom
    assert allocator.size == resize.tokens_after == kv.token_to_kv_pool.size
    assert allocator.get_kvcache() is kv.token_to_kv_pool  # SGLang's callers reach the pool through it
    assert allocator.available_size() == resize.tokens_after - 64
    allocator.free(held)  # still in use in the new allocator
    rows = resize.tokens_after + 16
    buffers = pool_buffers(kv.token_to_kv_pool)
    base, end = backing.allocation.base, backing.allocation.base + backing.allocation.reserved
    tails = [(t.data_ptr() + rows * 64, t.data_ptr() + t.shape[0] * 64) for t in buffers]  # 2 heads x 16 x bf16
    assert backing.allocation.kept == [(s - base, e - base) for s, e in complement(tails, base, end)]
    assert released == sum(e - s for s, e in tails)  # the request table and allocator lists stay


def test_a_resize_that_fails_after_the_allocator_shrank_leaves_the_old_allocator_and_pools_intact(make_engine):
    engine, runner, probe, held = _runner_after_capture(make_engine)
    kv = runner.kv_cache
    old, size = kv.token_to_kv_pool_allocator, kv.token_to_kv_pool.size
    free = old.available_size()
    backing = FakeBacking(kv.token_to_kv_pool, fails=True)  # releasing the tails fails
    with pytest.raises(VmmError, match="injected"):
        _apply(engine, runner, probe, backing)
    assert runner.token_to_kv_pool_allocator is old and kv.token_to_kv_pool.size == size
    assert old.available_size() == free  # not drained: every free token is free again
    old.free(held)  # and what was in use still is
    assert old.available_size() == free + 64
    assert old.alloc(old.available_size()) is not None


def test_a_failure_to_map_back_still_gives_the_old_allocator_its_free_tokens(make_engine):
    """The rollback restores the host-side allocator first: a mapping-back that fails too (the device
    ran out) left the old allocator drained, so nothing could be allocated afterwards."""
    engine, runner, probe, held = _runner_after_capture(make_engine)
    kv = runner.kv_cache
    old = kv.token_to_kv_pool_allocator
    free = old.available_size()
    backing = FakeBacking(kv.token_to_kv_pool, fails=True, remap_fails=True)
    with pytest.raises(VmmError, match="injected"):
        _apply(engine, runner, probe, backing)
    assert old.available_size() == free and backing.allocation.calls == ["keep_only", "map_within"]


def test_on_the_cpu_the_knob_changes_nothing_and_bootstrap_neither_captures_nor_resizes(make_engine):
    from kvcache.testing import tiny_model_config

    engine = make_engine(model=tiny_model_config(), enable_post_capture_kv_resize=True, memory_limit=1 << 30)
    engine.engine().bootstrap()
    runner = engine.engine().target
    assert runner.graph_capture is None and runner.post_capture_kv_resize is None
    assert not engine.target.configurator().sizing.post_capture_resize().active


@pytest.mark.parametrize(("dtype", "index_row_bytes", "row_bytes"), [
    ("bfloat16", 0, (128 + 64) * 2),
    ("fp4_e2m1", 0, 192 // 2 + 192 // 16),  # two values a byte, one scale byte per 16
    ("bfloat16", 132, (128 + 64) * 2 + 132),  # DSA: the indexer's 128 fp8 keys + one float32 scale
    ("fp8_e4m3", 132, 128 + 4 + 64 * 2 + 132),  # DSA fp8: the packed latent row, then the indexer's
])
def test_a_resize_releases_every_per_token_buffer_of_an_mla_pool(dtype: str, index_row_bytes: int,
                                                                row_bytes: int) -> None:
    """DSA's indexer keys are per token like the latent: a resize that kept their tails mapped would hold
    index_row_bytes x released rows x layers more than the resized plan says."""
    spec = MLASpec(128, 64, KV_CACHE_DTYPES[dtype], index_head_dim=128 if index_row_bytes else 0)  # DSA: 128 fp8 keys
    pool: Any = standalone_kv_pool(spec, tokens=64, page_size=16, layer_ids=range(3))  # + a float32 scale
    assert pool.index_row_bytes == index_row_bytes
    buffers = pool_buffers(pool)
    assert sum(t.nbytes for t in buffers) == 3 * 80 * row_bytes  # 3 layers x (64 + 16) rows
    released = released_address_ranges(buffers, 16 + 16)
    assert sum(e - s for s, e in released) == 3 * (80 - 32) * row_bytes  # rows 32..79 of every buffer


def test_the_swap_holds_a_bounded_chunk_beside_the_ids_of_the_grown_tokens():
    """3 int64 lists of one chunk (2^16 tokens: 1,572,864 B, or fewer where the lists are shorter), plus 8 B per
    grown token."""
    assert carry_transient_bytes(tokens=30_000_000, grown_tokens=-3_000_000) == 3 * 8 * 65_536 == 1_572_864
    assert carry_transient_bytes(tokens=1_000, grown_tokens=0) == 24_000
    assert carry_transient_bytes(tokens=30_000_000, grown_tokens=100_000) == 1_572_864 + 800_000
