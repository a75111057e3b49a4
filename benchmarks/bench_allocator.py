"""Allocator cost against pool size: ours (a free stack) vs SGLang's approach (a concatenated free list).

SGLang's allocators free with `torch.cat((free_pages, freed))`, which copies the
whole free list on every free, so a call's cost grows with the pool. Ours pushes
onto a preallocated stack and should stay flat. Each case keeps the pool half full
(as a busy server does) and times one alloc + free cycle, averaged over --repeat.
On CUDA both are mostly kernel-launch overhead in wall time, so the table adds the
GPU kernel time of a cycle (torch.profiler): the reference's grows with the pool.

    python benchmarks/bench_allocator.py [--device cuda] [--sizes 1e4 1e5 1e6 1e7]
                                         [--page-size 1 16] [--repeat 200] [--trials 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvcache.allocators import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator  # noqa: E402

ALLOC_TOKENS = 64
DECODE_BATCH = 256
WARMUP = 10
GPU_PROFILE_CYCLES = 50


class ConcatFreeList:
    """The reference: alloc slices the front of a free-page tensor, free concatenates onto it (SGLang's way)."""

    def __init__(self, *, size: int, page_size: int, device: torch.device) -> None:
        self.size = size
        self.page_size = page_size
        self.device = device
        self.free_pages = torch.arange(1, size // page_size + 1, dtype=torch.int64, device=device)

    def _take(self, n: int) -> torch.Tensor | None:
        if n > self.free_pages.numel():
            return None
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def alloc(self, need_size: int) -> torch.Tensor | None:
        pages = self._take(need_size // self.page_size)
        if pages is None or self.page_size == 1:
            return pages
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> torch.Tensor | None:
        starts = (seq_lens - 1) % self.page_size == 0
        pages = self._take(int(starts.sum()))
        return None if pages is None else (last_loc + 1).masked_scatter(starts, pages * self.page_size)

    def free(self, indices: torch.Tensor) -> None:
        pages = indices if self.page_size == 1 else torch.unique(indices // self.page_size)
        self.free_pages = torch.cat((self.free_pages, pages))


Allocator = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator | ConcatFreeList


@dataclass(frozen=True, slots=True)
class Row:
    """One measured case: microseconds of one alloc + free cycle, ours and the reference.

    *_us is host wall time; *_gpu_us (CUDA only) is the kernel time the cycle puts on the
    GPU, which wall time hides when both are bound by kernel-launch overhead.
    """

    page_size: int
    workload: str
    pool_tokens: int
    ours_us: float
    concat_us: float
    ours_gpu_us: float | None = None
    concat_gpu_us: float | None = None


def ours(size: int, page_size: int, device: torch.device) -> Allocator:
    if page_size == 1:
        return TokenToKVPoolAllocator(size=size, device=device)
    return PagedTokenToKVPoolAllocator(size=size, page_size=page_size, device=device)


def workloads(page_size: int, device: torch.device) -> dict[str, Callable[[Allocator], torch.Tensor | None]]:
    """name -> one allocation; its result is freed right after. Decode: every request starts a page."""
    if page_size == 1:
        return {f"alloc {ALLOC_TOKENS}": lambda a: a.alloc(ALLOC_TOKENS),
                f"decode batch {DECODE_BATCH}": lambda a: a.alloc(DECODE_BATCH)}
    seq_lens = torch.arange(DECODE_BATCH, dtype=torch.int64, device=device) * page_size + 1
    last_loc = torch.full((DECODE_BATCH,), -1, dtype=torch.int64, device=device)
    return {f"alloc {ALLOC_TOKENS}": lambda a: a.alloc(ALLOC_TOKENS),
            f"decode batch {DECODE_BATCH}": lambda a: a.alloc_decode(seq_lens, last_loc)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_kernel_seconds(a: Allocator, step: Callable[[Allocator], torch.Tensor | None], cycles: int) -> float:
    """Mean GPU kernel time of step + free, summed from the profiler's CUDA activity."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(cycles):
            a.free(step(a))  # type: ignore[arg-type]
        torch.cuda.synchronize()
    total_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                   for e in prof.key_averages())
    return total_us * 1e-6 / cycles


def cycle_seconds(a: Allocator, step: Callable[[Allocator], torch.Tensor | None], repeat: int,
                  trials: int, device: torch.device) -> tuple[float, float | None]:
    """Mean wall time of step + free over `repeat` cycles, best of `trials`, half the pool held
    throughout; and on CUDA the mean GPU kernel time of a cycle.

    Best of several means, as timeit reports, because a shared machine only ever adds noise.
    """
    held = a.alloc(a.size // 2 // a.page_size * a.page_size)
    assert held is not None
    for _ in range(WARMUP):
        out = step(a)
        assert out is not None
        a.free(out)
    best = float("inf")
    for _ in range(trials):
        sync(device)
        start = time.perf_counter()
        for _ in range(repeat):
            a.free(step(a))  # type: ignore[arg-type]
        sync(device)
        best = min(best, (time.perf_counter() - start) / repeat)
    gpu = gpu_kernel_seconds(a, step, min(repeat, GPU_PROFILE_CYCLES)) if device.type == "cuda" else None
    return best, gpu


def measure(sizes: list[int], page_sizes: list[int], repeat: int, trials: int, device: torch.device) -> list[Row]:
    rows = []
    for page_size in page_sizes:
        for name, step in workloads(page_size, device).items():
            for size in sizes:
                size = size // page_size * page_size
                ours_s, ours_gpu = cycle_seconds(ours(size, page_size, device), step, repeat, trials, device)
                ref_s, ref_gpu = cycle_seconds(ConcatFreeList(size=size, page_size=page_size, device=device),
                                               step, repeat, trials, device)
                rows.append(Row(page_size, name, size, ours_s * 1e6, ref_s * 1e6,
                                None if ours_gpu is None else ours_gpu * 1e6,
                                None if ref_gpu is None else ref_gpu * 1e6))
    return rows


def describe(device: torch.device) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return f"torch {torch.__version__}, device {device} ({where}), {torch.get_num_threads()} torch threads"


def markdown(rows: list[Row], repeat: int, trials: int) -> str:
    gpu = any(r.ours_gpu_us is not None for r in rows)
    lines = [
        f"alloc + free of the result, pool half full; microseconds per cycle, host wall time as the "
        f"mean of {repeat} cycles, best of {trials} trials"
        + (f"; GPU kernel time from the profiler over {min(repeat, GPU_PROFILE_CYCLES)} cycles" if gpu else ""),
        "",
        "| page size | workload | pool tokens | free stack (ours) | cat free list (SGLang-style) | cat / ours |"
        + (" ours GPU | cat GPU |" if gpu else ""),
        "|---:|:---|---:|---:|---:|---:|" + ("---:|---:|" if gpu else ""),
    ]
    for r in rows:
        line = (f"| {r.page_size} | {r.workload} | {r.pool_tokens:,} | {r.ours_us:.1f} | {r.concat_us:.1f} "
                f"| {r.concat_us / r.ours_us:.1f}x |")
        if gpu:
            line += f" {r.ours_gpu_us:.1f} | {r.concat_gpu_us:.1f} |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6, 1e7], help="pool sizes in tokens")
    parser.add_argument("--page-size", nargs="+", type=int, default=[1, 16], dest="page_sizes")
    parser.add_argument("--repeat", type=int, default=200, help="cycles per trial")
    parser.add_argument("--trials", type=int, default=5, help="report the best trial's mean")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    ns = parser.parse_args()
    device = torch.device(ns.device)
    rows = measure([int(s) for s in ns.sizes], ns.page_sizes, ns.repeat, ns.trials, device)
    print(describe(device))
    print()
    print(markdown(rows, ns.repeat, ns.trials))
    if ns.json:
        ns.json.write_text(json.dumps({"setup": describe(device), "repeat": ns.repeat, "trials": ns.trials,
                                       "rows": [asdict(r) for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
