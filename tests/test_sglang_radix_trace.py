"""SGLang 0.5.23's own RadixCache and scheduler helpers drive our request table and allocators with no shim.

Runs benchmarks/sglang_radix_trace.py (SGLang's real code from the unpacked reference tree, skipped without
it) at page sizes 1 and 4, full attention and sliding window: no index lost, held twice or 0, every pool full
again at the end, and the same indices as SGLang's allocators (page 1 at every step; paged until freed pages
are reused).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from reference_sources import benchmarks_importable, reference_src_holding

TRITON_PATHS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture()
def sglang_src() -> Path:
    """SGLang 0.5.23's source tree (KVCACHE_sglang_src); the test skips without it."""
    return reference_src_holding("sglang/srt/mem_cache/radix_cache.py", "SGLang")


@pytest.fixture()
def trace(sglang_src: Path) -> Iterator[ModuleType]:
    """The driver module; the stand-in modules, finders and path entries it adds are removed afterwards.

    Only sglang's modules and the two benchmark scripts go: a real library first imported meanwhile (triton,
    loaded by SGLang's kernel file) stays, as a compiled extension cannot be imported twice."""
    pytest.importorskip("numpy", reason="SGLang's mem_cache imports NumPy, which this project does not install")
    with benchmarks_importable():
        import sglang_radix_trace

        yield sglang_radix_trace


def test_sglang_radix_cache_runs_on_our_objects_and_matches_sglangs_allocator(trace: ModuleType, sglang_src: Path) -> None:
    lines: list[str] = []
    trace.run_all(sglang_src, page_sizes=(1, 4), report=lines.append)
    assert len(lines) == 4
    page1, page4, swa1, swa4 = lines
    assert "ours vs SGLang's allocator: the same indices at every step" in page1
    assert "the same page layout at every step" in page4
    for line in lines:
        assert " 0 evicted under pressure" not in line  # every run evicts to make room
    assert "0 window slots freed early" not in swa1 + swa4
    assert "SWA allocator: the same indices at every step (SWA peers too)" in swa1
    assert "the same page layout at every step" in swa4


def test_the_trace_catches_an_allocator_handing_out_held_indices(trace: ModuleType, sglang_src: Path) -> None:
    # An allocator that hands out 1..n at every call (held indices, never taken from its free list) fails the census.
    work = trace.Workload(page_size=1)
    req_pool, allocator = trace.ours(work)
    allocator.alloc = lambda n: torch.arange(1, n + 1)
    trace.load_sglang(sglang_src, use_triton=False)
    sg = trace.load_sglang_radix(sglang_src)
    with pytest.raises(AssertionError, match="held twice|is lost"):
        trace.Trace(sg, work, req_pool, allocator).run()



@pytest.mark.skipif(not TRITON_PATHS, reason="needs CUDA, or TRITON_INTERPRET=1 with NumPy")
def test_sglangs_triton_paths_run_on_our_objects(trace: ModuleType, sglang_src: Path) -> None:
    # SGLang's Triton row write fills OUR request table from device pointers; on CUDA our paged and SWA
    # allocators run their kernels under SGLang's cache, beside SGLang's Triton allocators.
    lines: list[str] = []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trace.run_all(sglang_src, page_sizes=(1, 16), report=lines.append, device=device, triton=True)
    page1, page16, swa1, swa16 = lines
    assert "ours vs SGLang's allocator: the same indices at every step" in page1
    assert "SWA allocator: the same indices at every step (SWA peers too)" in swa1
    assert "the same page layout at every step" in page16 and "the same page layout at every step" in swa16
