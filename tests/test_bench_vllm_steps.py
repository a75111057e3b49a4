"""The allocator benchmark's vLLM scheduler-path column computes what ours hands out, and keeps a steady pool.

Runs vLLM 0.34.0's real KV cache manager and CPU block table from the unpacked reference tree;
skips without that tree or without numpy (neither is in a fresh CI venv).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from reference_sources import benchmarks_importable, reference_src_holding

from kvcache.testing.allocator_plans import paged_allocator



@pytest.fixture(scope="module")
def vllm() -> Iterator[SimpleNamespace]:
    """vLLM's classes loaded through the benchmark's loader; the stand-in modules are removed afterwards."""
    pytest.importorskip("numpy")
    reference_src = reference_src_holding("vllm/v1/core/kv_cache_manager.py", "vLLM")
    with benchmarks_importable():
        from reference_allocators import load_vllm
        from vllm_steps import SchedulerPath

        yield SimpleNamespace(classes=load_vllm(reference_src), SchedulerPath=SchedulerPath)


def _t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("computed", [[0, 0], [7, 4]])
def test_slot_mapping_equals_ours_on_a_fresh_pool(vllm: SimpleNamespace, computed: list[int]) -> None:
    # page 4, 16 pages: request A 7 tokens (pages 1, 2), B 4 tokens (page 3), then one decode token each:
    # A continues page 2 at slot 11, B starts page 4 at slot 16. Both allocators number pages from 1.
    ours = paged_allocator(size=64, page_size=4, device="cpu")
    prefill = ours.alloc_extend(_t(0, 0), _t(0, 0), _t(7, 4), _t(7, 4), _t(-1, -1), 11)
    assert prefill.tolist() == [4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15]
    decode = ours.alloc_decode(_t(8, 5), _t(8, 5), _t(10, 15))
    assert decode.tolist() == [11, 16]
    new_tokens = [7, 4] if computed == [0, 0] else [1, 1]
    path = vllm.SchedulerPath(vllm.classes, 64, 4, computed, new_tokens, hold_half=False)
    path.allocate()
    assert path.slots().tolist() == (prefill if computed == [0, 0] else decode).tolist()


def test_decode_step_rotates_one_page_per_crossing_without_losing_blocks(vllm: SimpleNamespace) -> None:
    ps = 16
    path = vllm.SchedulerPath.for_workload(vllm.classes, 10_000, ps, "decode")
    pool = path.manager.block_pool
    path.step(0)
    steady = pool.get_num_free_blocks()
    for i in range(1, 2 * ps + 1):
        path.step(i)
        slots = path.slots().tolist()
        assert len(set(slots)) == 256
        assert sum(slot % ps == 0 for slot in slots) == 256 // ps  # 1/ps of the requests start a page
        for row, slot in enumerate(slots):
            assert slot // ps in {block.block_id for block in path.blocks_of(row)}
        assert pool.get_num_free_blocks() == steady  # each crossing gives back the page it took a cycle ago
