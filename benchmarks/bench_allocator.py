"""Allocator steps side by side in one run: ours vs SGLang 0.5.23's real allocators vs vLLM 0.34.0's real code.

Each step is what a busy server does per scheduler iteration, with half the pool held:

- page 1:  alloc(256) and free the result (SGLang: TokenToKVPoolAllocator; vLLM: a
           BlockPool of 1-token blocks, get_new_blocks(256) + free_blocks).
- decode:  256 requests, 1/page_size of them starting a page (the phase rotates each
           step); alloc_decode(seq_lens, seq_lens_cpu, last_loc), then free_page_ids of
           the pages it took (vLLM: get_new_blocks(k) + free_blocks).
- extend:  8 requests of 256 new tokens, half continuing a partial page;
           alloc_extend(...) with SGLang 0.5.23's arguments, then free_segments of the
           fresh pages (vLLM: get_new_blocks(k) + free_blocks).

Two vLLM columns (benchmarks/vllm_steps.py): "BlockPool only" is get_new_blocks(k) +
free_blocks of the same number of blocks, block-id bookkeeping with no slot index, the
floor for host work; "scheduler path" (CPU runs only) is what vLLM's scheduler and CPU
model runner call to get one slot per new token for the same batch -- allocate_slots for
every request, the block-table append, the slot mapping (its compiled op stood in for by
numpy, whose share is shown) and free_blocks of what the step took -- time inside those
calls only (compare with ours' allocator calls). On CUDA each step also counts host syncs
(torch.cuda.set_sync_debug_mode("warn")) and checks that SGLang's Triton kernels ran
and agree with ours. Two times per step, in microseconds of host wall time: the whole
step, and the part spent inside the allocator's own calls (the decode step's harness
also picks out the pages to free, with two device ops, the same for every allocator).
Each is the median over 50-step chunks of a time-boxed run (robust to a busy machine),
best of --trials.

    python benchmarks/bench_allocator.py --reference-src /path/to/site-packages [--device cuda]
        [--sizes 1e4 1e5 1e6 1e7] [--page-sizes 1 16 64] [--trials 3] [--json out.json]

--reference-src holds sglang/ and vllm/ source trees (pip install --no-deps of the two
wheels into a scratch venv, or a copy of the few files benchmarks/reference_allocators.py names).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from kvcache.testing.allocator_plans import paged_allocator, token_allocator# noqa: E402
from reference_allocators import load_sglang, load_vllm  # noqa: E402
from reference_tree import add_reference_src_argument  # noqa: E402
from vllm_steps import SchedulerPath, block_pool_step  # noqa: E402

DECODE_BATCH = 256
EXTEND_BATCH, EXTEND_TOKENS = 8, 256
TIME_BOX_S = 0.25
MAX_STEPS = 2000
VLLM_MAX_BLOCKS = 2_000_000  # a Python object per block: larger pools take minutes to build (both vLLM columns)


@dataclass(frozen=True, slots=True)
class Row:
    workload: str
    page_size: int
    pool_tokens: int
    ours_us: float
    sglang_us: float | None
    vllm_us: float | None
    ours_alloc_us: float  # inside the allocator's calls only
    sglang_alloc_us: float | None
    ours_syncs: float | None = None  # host syncs per step (CUDA only)
    sglang_syncs: float | None = None
    vllm_path_us: float | None = None  # vLLM scheduler path, inside its calls (CPU only)
    vllm_slots_us: float | None = None  # of which the slot-mapping stand-in


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Step = Callable[[int], float]  # runs step i; returns the seconds spent inside the allocator's calls
CHUNK = 50


def run_time(step: Step, device: torch.device, first: int) -> tuple[float, float]:
    """Median seconds per step over 50-step chunks of one time-boxed run: (whole step, allocator calls)."""
    walls, inside = [], []
    start, n = time.perf_counter(), 0
    while n < MAX_STEPS and (n < 2 * CHUNK or time.perf_counter() - start < TIME_BOX_S):
        sync(device)
        chunk_start, spent = time.perf_counter(), 0.0
        for i in range(CHUNK):
            spent += step(first + n + i)
        sync(device)
        walls.append((time.perf_counter() - chunk_start) / CHUNK)
        inside.append(spent / CHUNK)
        n += CHUNK
    return statistics.median(walls), statistics.median(inside)


def step_times(steps: dict[str, tuple[Step, torch.device]], trials: int) -> dict[str, tuple[float, float]]:
    """Best-of-trials (wall, allocator) seconds per step of each, trials interleaved so load hits all alike."""
    for step, _ in steps.values():
        for i in range(5):
            step(i)
    best = dict.fromkeys(steps, (float("inf"), float("inf")))
    for trial in range(trials):
        for name, (step, device) in steps.items():
            wall, inside = run_time(step, device, 5 + trial * MAX_STEPS)
            best[name] = (min(best[name][0], wall), min(best[name][1], inside))
    return best


def syncs_per_step(step: Step, device: torch.device, steps: int = 20) -> float | None:
    """Host syncs per step, counted by torch's sync debug mode (CUDA only)."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(steps):
                step(1000 + i)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("called a synchronizing cuda operation" in str(w.message).lower() for w in caught) / steps


class Batches:
    """Per-phase decode and extend inputs (device tensors and their CPU copies), built once."""

    def __init__(self, page_size: int, held_pages: torch.Tensor, device: torch.device) -> None:
        ps = page_size
        self.device = device
        self.decode: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        req = torch.arange(DECODE_BATCH)
        page_of = held_pages[req % held_pages.numel()]
        for phase in range(ps):
            seq = 8 * ps + (req - phase) % ps + 1  # requests with (req - phase) % ps == 0 start a page
            last = page_of * ps + (seq - 2) % ps
            starting = ((seq - 1) % ps == 0).nonzero().squeeze(1)
            self.decode.append((seq.to(device), seq, last.to(device), starting.to(device)))
        prefix = torch.tensor([ps * 4 + (ps // 2 if i % 2 else 0) for i in range(EXTEND_BATCH)])
        seq = prefix + EXTEND_TOKENS
        kept = (prefix + ps - 1) // ps
        self.extend_args = (prefix.to(device), prefix, seq.to(device), seq, (held_pages[:EXTEND_BATCH] * ps +
                            (prefix - 1) % ps).to(device), EXTEND_TOKENS * EXTEND_BATCH)
        # the fresh part of each request's new tokens: out[offset + cont : offset + len], from position kept * ps
        self.fresh_segments = [(i * EXTEND_TOKENS + int(kept[i] * ps - prefix[i]), (i + 1) * EXTEND_TOKENS,
                                int(kept[i] * ps)) for i in range(EXTEND_BATCH)]
        self.extend_new_pages = int(((seq + ps - 1) // ps - kept).sum())


def our_allocator(size: int, ps: int, device: torch.device) -> Any:
    if ps == 1:
        return token_allocator(size=size, device=device)
    return paged_allocator(size=size, page_size=ps, device=device)


def sglang_allocator(sglang: Any, size: int, ps: int, device: torch.device) -> Any:
    if ps == 1:
        return sglang.TokenToKVPoolAllocator(size, torch.int64, str(device), None, False)
    return sglang.PagedTokenToKVPoolAllocator(size, ps, torch.int64, str(device), None, False)


def token_steps(a: Any, ps: int, batches: Batches | None, workload: str) -> Step:
    """One step of `workload` on an SGLang-API allocator (ours or SGLang's)."""
    clock = time.perf_counter
    if workload == "page 1":
        def step(i: int) -> float:
            t0 = clock()
            a.free(a.alloc(DECODE_BATCH))
            return clock() - t0
        return step
    assert batches is not None
    if workload == "decode":
        def step(i: int) -> float:
            seq, seq_cpu, last, starting = batches.decode[i % ps]
            t0 = clock()
            out = a.alloc_decode(seq, seq_cpu, last)
            t1 = clock()
            pages = torch.index_select(out, 0, starting) // ps  # harness: the pages this step took
            t2 = clock()
            a.free_page_ids(pages)
            return clock() - t2 + t1 - t0
        return step

    def step(i: int) -> float:
        t0 = clock()
        out = a.alloc_extend(*batches.extend_args)
        for lo, hi, pos in batches.fresh_segments:  # each request's fresh pages, as its row segment
            a.free_segment(out[lo:hi], start_pos=pos)
        return clock() - t0
    return step


def agree(ours: Any, theirs: Any, batches: Batches, ps: int) -> bool:
    """Fresh allocators of both kinds hand out the same indices for the same decode and extend batches."""
    seq, seq_cpu, last, _ = batches.decode[0]
    same = torch.equal(ours.alloc_decode(seq, seq_cpu, last), theirs.alloc_decode(seq, seq_cpu, last))
    return same and torch.equal(ours.alloc_extend(*batches.extend_args), theirs.alloc_extend(*batches.extend_args))


def measure(sizes: list[int], page_sizes: list[int], trials: int, device: torch.device, root: Path) -> tuple[list[Row], dict[str, Any]]:
    sglang = load_sglang(root, use_triton=device.type == "cuda")
    vllm = load_vllm(root)
    rows, checks = [], {}
    for ps in page_sizes:
        for workload in (["page 1"] if ps == 1 else ["decode", "extend"]):
            for size in sizes:
                size = size // ps * ps
                steps: dict[str, tuple[Step, torch.device]] = {}
                for name in ("ours", "sglang"):
                    a = our_allocator(size, ps, device) if name == "ours" else sglang_allocator(sglang, size, ps, device)
                    held = a.alloc(size // 2 // ps * ps)
                    batches = None if ps == 1 else Batches(ps, (held[::ps] // ps).cpu(), device)
                    steps[name] = (token_steps(a, ps, batches, workload), device)
                    if name == "sglang" and batches is not None and device.type == "cuda" and workload == "decode":
                        checks[f"page {ps}, {size:,} tokens: SGLang (Triton) and ours agree"] = agree(
                            our_allocator(size, ps, device), sglang_allocator(sglang, size, ps, device), batches, ps)
                path = None
                if size // ps <= VLLM_MAX_BLOCKS:
                    pool = vllm.BlockPool(num_gpu_blocks=size // ps + 1, enable_caching=False, hash_block_size=ps)
                    pool.get_new_blocks(size // 2 // ps)
                    count = {"page 1": DECODE_BATCH, "decode": DECODE_BATCH // ps}.get(workload)
                    if count is None:
                        count = Batches(ps, torch.arange(1, EXTEND_BATCH + 1), torch.device("cpu")).extend_new_pages
                    steps["vllm"] = (block_pool_step(pool, count), torch.device("cpu"))
                    path = SchedulerPath.for_workload(vllm, size, ps, workload) if device.type == "cpu" else None
                    if path is not None:  # None: too small for 256 requests' own pages
                        steps["vllm path"] = (path.step, torch.device("cpu"))
                best = step_times(steps, trials)
                syncs = {name: syncs_per_step(steps[name][0], device) for name in ("ours", "sglang")}
                vllm_us = best["vllm"][0] * 1e6 if "vllm" in best else None
                path_us = best["vllm path"][1] * 1e6 if "vllm path" in best else None
                slots_us = path.slot_mapping_seconds() * 1e6 if path_us is not None else None
                rows.append(Row(workload, ps, size, best["ours"][0] * 1e6, best["sglang"][0] * 1e6, vllm_us,
                                best["ours"][1] * 1e6, best["sglang"][1] * 1e6, syncs["ours"], syncs["sglang"],
                                path_us, slots_us))
                print(rows[-1], flush=True)
    if device.type == "cuda":
        ran = {name: bool(getattr(sglang.kernels, name).device_caches) if hasattr(getattr(sglang.kernels, name), "device_caches")
               else bool(getattr(getattr(sglang.kernels, name), "cache", {}))
               for name in ("alloc_decode_kernel", "alloc_extend_kernel")}
        checks["SGLang Triton kernels compiled and ran"] = ran
    return rows, checks


def describe(device: torch.device) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return f"torch {torch.__version__}, device {device} ({where}), {torch.get_num_threads()} torch threads"


def markdown(rows: list[Row], gpu: bool) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.1f}x"  # noqa: E731
    head = ("| workload | page | pool tokens | ours | SGLang 0.5.23 | vLLM BlockPool only, no slot indices "
            "| vLLM scheduler path: allocate_slots + slot mapping, calls | of which slot mapping (numpy stand-in) "
            "| SGLang / ours | ours, allocator calls | SGLang, allocator calls | SGLang / ours, allocator calls "
            "| vLLM path / ours, allocator calls |")
    rule = "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if gpu:
        head, rule = head + " syncs/step ours | syncs/step SGLang |", rule + "---:|---:|"
    lines = ["microseconds of host wall time per step (median of 50-step chunks, best of trials)", "", head, rule]
    for r in rows:
        line = (f"| {r.workload} | {r.page_size} | {r.pool_tokens:,} | {fmt(r.ours_us)} | {fmt(r.sglang_us)} "
                f"| {fmt(r.vllm_us)} | {fmt(r.vllm_path_us)} | {fmt(r.vllm_slots_us)} "
                f"| {ratio(r.sglang_us, r.ours_us)} | {fmt(r.ours_alloc_us)} | {fmt(r.sglang_alloc_us)} "
                f"| {ratio(r.sglang_alloc_us, r.ours_alloc_us)} | {ratio(r.vllm_path_us, r.ours_alloc_us)} |")
        if gpu:
            line += f" {fmt(r.ours_syncs)} | {fmt(r.sglang_syncs)} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_reference_src_argument(parser, "sglang/ and vllm/ (SGLang 0.5.23's and vLLM 0.34.0's sources)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6, 1e7], help="pool sizes in tokens")
    parser.add_argument("--page-sizes", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--trials", type=int, default=3, help="report the best trial's mean")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    ns = parser.parse_args(argv)
    device = torch.device(ns.device)
    rows, checks = measure([int(s) for s in ns.sizes], ns.page_sizes, ns.trials, device, ns.reference_src)
    print(describe(device))
    print()
    print(markdown(rows, device.type == "cuda"))
    for name, value in checks.items():
        print(f"check: {name}: {value}")
    if ns.json:
        ns.json.write_text(json.dumps({"setup": describe(device), "rows": [asdict(r) for r in rows],
                                       "checks": {k: str(v) for k, v in checks.items()}}, indent=2))


if __name__ == "__main__":
    main()
