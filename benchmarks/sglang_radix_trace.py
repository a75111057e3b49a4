"""SGLang 0.5.23's own radix cache and scheduler helpers, run on our request table and allocators, and on SGLang's.

The helpers are SGLang's real code, loaded from a source tree by reference_allocators.load_sglang_radix:
RadixCache (and PureSWARadixCache for the sliding-window run), match_kv_cache, checkpoint_kv_cache,
release_kv_cache, alloc_for_extend and alloc_for_decode (which evict through evict_from_tree_cache).
Only the scheduler around them is ours: a few waves of requests sharing prefixes, each admitted
(match + lock), prefilled in chunks, decoded, then released in one free group; later waves run out
of room and evict. After every step the census holds: every index is held once by the tree or a
live request, none is 0, none is lost. At the end the tree is evicted and every pool must be full
again. On fresh pools ours and SGLang's allocators hand out the same indices, at page 1 at every step,
paged until freed pages are reused (SGLang's paged free list hands those out first); our request table
and SGLang's are interchangeable under either allocator.

    python benchmarks/sglang_radix_trace.py [--reference-src DIR, default $KVCACHE_REFERENCE_SRC] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcache.pools import ReqToTokenPool  # noqa: E402
from kvcache.sizing.pool_config import request_table_slot  # noqa: E402
from kvcache.testing.allocator_plans import paged_allocator, swa_allocator, token_allocator# noqa: E402
from reference_allocators import load_sglang, load_sglang_radix  # noqa: E402
from reference_tree import add_reference_src_argument  # noqa: E402
from sglang_request_fakes import Batch, Req  # noqa: E402


@dataclass(frozen=True)
class Workload:
    """Waves of requests: a shared system prefix, per-wave shared documents, unique questions."""

    page_size: int
    waves: int = 3
    per_wave: int = 3
    decode_steps: int = 5
    rows: int = 8
    device: str = "cpu"

    @property
    def pool_size(self) -> int:
        """One wave's peak without its shared prefixes: later waves must evict what earlier ones left."""
        ps = self.page_size
        return ps * sum(-(-(len(p) + self.decode_steps) // ps) for p in self.prompts(0))

    @property
    def chunk(self) -> int:
        return 2 * self.page_size + 3  # not page-aligned: chunks end mid-page

    def prompts(self, wave: int) -> list[array]:
        ps = self.page_size
        system = list(range(1000, 1000 + ps + 2))
        document = list(range(2000 + 100 * (wave % 2), 2000 + 100 * (wave % 2) + ps + 1))
        return [array("q", system + document + [5000 + 50 * wave + 7 * i + j for j in range(i + 2)])
                for i in range(self.per_wave)]


class Trace:
    """One run of the workload through SGLang's cache on one (request table, allocator) pair."""

    def __init__(self, sg: SimpleNamespace, work: Workload, req_pool: Any, allocator: Any, *, swa_window: int = 0):
        self.sg, self.work, self.req_pool, self.allocator = sg, work, req_pool, allocator
        params = sg.CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator,
                                    page_size=work.page_size, sliding_window_size=swa_window or None)
        self.tree = (sg.PureSWARadixCache if swa_window else sg.RadixCache)(params)
        self.swa = bool(swa_window)
        self.handed_out: list[list[int]] = []
        self.swa_handed_out: list[list[int]] = []  # the SWA side's peers of handed_out (SWA runs)
        self.after_a_free: list[bool] = []  # whether any index had gone back before this step's alloc returned
        self.evicted = self.window_freed = 0
        evict = self.tree.evict

        def counted(params: Any) -> Any:  # observes SGLang's eviction, changes nothing
            result = evict(params)
            self.evicted += result.num_tokens_evicted
            return result
        self.tree.evict = counted
        self.live: list[Req] = []
        self.start = self.sizes()

    def sizes(self) -> tuple[int, ...]:
        sides = (self.allocator.full_available_size(), self.allocator.swa_available_size()) if self.swa else ()
        return (self.allocator.available_size(), self.req_pool.available_size()) + sides

    def run(self) -> Trace:
        for wave in range(self.work.waves):
            reqs = [self.admit(f"w{wave}r{i}", prompt) for i, prompt in enumerate(self.work.prompts(wave))]
            while any(r.extend_end < len(r.origin_input_ids) or r.kv.kv_allocated_len == 0 for r in reqs):
                self.extend([r for r in reqs if r.kv.kv_committed_len < len(r.origin_input_ids)])
            for step in range(self.work.decode_steps):
                self.decode(reqs, step)
            self.release(reqs, abort_last=wave == 1)
        self.evicted_under_pressure = self.evicted
        self.tree.evict(self.sg.EvictParams(num_tokens=1 << 40))
        assert self.tree.evictable_size() == 0 and self.tree.protected_size() == 0
        assert self.sizes() == self.start, f"pools do not return to the start: {self.sizes()} != {self.start}"
        return self

    def batch(self, reqs: list[Req]) -> Batch:
        return Batch(reqs, self.tree, self.req_pool, device=self.work.device)

    def admit(self, rid: str, prompt: array) -> Req:
        """init_next_round_input + the prefill adder: match the prompt, protect the hit, lock its node."""
        req = Req(rid, prompt, self.sg.ReqKvInfo())
        req.refresh_fill_ids()
        req.kv.swa_evict_floor = len(prompt) if self.swa else 0  # prefill-aware SWA: the prompt stays cacheable
        self.sg.match_kv_cache(req, self.tree, prompt, max_prefix_len=len(prompt) - 1)
        req.kv.cache_protected_len = req.prefix_len
        req.lock = self.tree.lock(req.last_node)
        self.live.append(req)
        return req

    def extend(self, reqs: list[Req]) -> None:
        for req in reqs:
            req.extend_end = min(req.prefix_len + self.work.chunk, len(req.origin_input_ids))
        out, _, _ = self.sg.alloc_for_extend(self.batch(reqs).for_extend())
        self.record(out)
        for req in reqs:
            if req.extend_end < len(req.origin_input_ids):
                self.sg.checkpoint_kv_cache(req, self.tree)  # a chunk ends: publish it, as the scheduler does
            else:
                req.prefix_len = req.extend_end
                req.output_ids.append(7000 + len(req.origin_input_ids))  # the prefill's sampled token

    def decode(self, reqs: list[Req], step: int) -> None:
        batch = self.batch(reqs).for_decode()
        batch.maybe_evict_swa()
        self.record(self.sg.alloc_for_decode(batch, 1))
        for req in reqs:
            req.output_ids.append(8000 + step)
            req.refresh_fill_ids()

    def release(self, reqs: list[Req], *, abort_last: bool) -> None:
        """Finished requests go back in one free group; an aborted one skips the tree insert."""
        self.allocator.free_group_begin()
        for req in reqs:
            req.finished_reason = "length"
            self.sg.release_kv_cache(req, self.tree, checkpoint=not (abort_last and req is reqs[-1]))
            self.live.remove(req)
        self.allocator.free_group_end()
        self.census()

    def record(self, out: torch.Tensor) -> None:
        assert out.dtype == torch.int64 and out.device.type == torch.device(self.work.device).type, (out.dtype, out.device)
        self.handed_out.append(out.tolist())
        ps = self.work.page_size
        ever = {i // ps for step in self.handed_out for i in step}
        in_use = self.start[2 if self.swa else 0] - (self.allocator.full_available_size() if self.swa
                                                     else self.allocator.available_size())
        self.after_a_free.append(in_use < len(ever) * ps)
        if self.swa:  # the peers, and how many tokens' window slot went back while their full slot stays
            self.swa_handed_out.append(self.allocator.translate_loc_from_full_to_swa(out).tolist())
            self.window_freed = max(self.window_freed, self.allocator.swa_available_size() - self.allocator.full_available_size())
        self.census()

    def census(self) -> None:
        """Every index held once (tree nodes + live rows past the tree's part), none 0, and the sum adds up."""
        held = self.tree.all_values_flatten().tolist() if self.tree.root_node.children else []
        for req in self.live:
            row = self.req_pool.req_to_token[req.kv.req_pool_idx]
            held += row[req.kv.cache_protected_len:req.kv.kv_allocated_len].tolist()
        assert 0 not in held, "index 0 (padding) handed out"
        assert len(set(held)) == len(held), "an index is held twice"
        ps = self.work.page_size
        pages = {i // ps for i in held}
        free = self.allocator.full_available_size() if self.swa else self.allocator.available_size()
        assert free + len(pages) * ps == self.start[0 if not self.swa else 2], "an index is lost"


def ours(work: Workload, swa_window: int = 0) -> tuple[ReqToTokenPool, Any]:
    """Our request table and allocator, refusing double frees, id 0 and ids out of range (check_frees)."""
    size, ps, device = work.pool_size, work.page_size, work.device
    req_pool = ReqToTokenPool(slot=request_table_slot(work.rows, 128), device=torch.device(device))
    if swa_window:
        return req_pool, swa_allocator(full_size=size, swa_size=size, page_size=ps, device=device, check_frees=True)
    if ps == 1:
        return req_pool, token_allocator(size=size, device=device, check_frees=True)
    return req_pool, paged_allocator(size=size, page_size=ps, device=device, check_frees=True)


def sglangs(alloc_classes: SimpleNamespace, sg: SimpleNamespace, work: Workload, swa_window: int = 0) -> tuple[Any, Any]:
    """SGLang's request table and allocator (need_sort off, as SGLang's scheduler builds them by default)."""
    size, ps, device = work.pool_size, work.page_size, work.device
    req_pool = sg.ReqToTokenPool(work.rows, 128, device, False)
    if swa_window:
        return req_pool, sg.SWATokenToKVPoolAllocator(size, size, ps, torch.int64, device, sg.SWAIndexPool(), False)
    if ps == 1:
        return req_pool, alloc_classes.TokenToKVPoolAllocator(size, torch.int64, device, None, False)
    return req_pool, alloc_classes.PagedTokenToKVPoolAllocator(size, ps, torch.int64, device, None, False)


def compare(a: Trace, b: Trace) -> str:
    """Ours (a) against SGLang's allocator (b): the same indices until a page has been freed and handed out
    again; after that the same shape (lengths, offsets in the page). Says where the indices first differ."""
    ps = a.work.page_size
    assert len(a.handed_out) == len(b.handed_out), (len(a.handed_out), len(b.handed_out))
    first = next((step for step, (x, y) in enumerate(zip(a.handed_out, b.handed_out)) if x != y), None)
    if first is None:
        assert a.swa_handed_out == b.swa_handed_out, "the same full indices with different SWA peers"
        return "the same indices at every step" + (" (SWA peers too)" if a.swa else "")
    assert a.after_a_free[first] and ps > 1, f"step {first} differs before any free: {a.handed_out[first]} vs " \
                                             f"{b.handed_out[first]}"
    for x, y in zip(a.handed_out, b.handed_out):
        assert [i % ps for i in x] == [i % ps for i in y], "a step's page layout differs"
    return (f"the same indices until step {first}, the first to reuse freed pages (SGLang's paged allocator puts "
            f"freed pages at the front of its free list, ours appends them to its log); the same page layout at "
            f"every step")


def run_all(reference_src: Path, page_sizes: tuple[int, ...] = (1, 16), report: Callable[[str], Any] = print,
            device: str = "cpu", triton: bool | None = None) -> None:
    """Every run of the module docstring; raises AssertionError at the first broken invariant. With triton (the
    default on CUDA) SGLang takes its Triton paths: row writes, paged kernels; on CUDA ours runs its kernels too."""
    triton = torch.device(device).type == "cuda" if triton is None else triton
    alloc_classes = load_sglang(reference_src, use_triton=triton)
    sg = load_sglang_radix(reference_src, use_triton=triton)
    for ps in page_sizes:
        work = Workload(page_size=ps, device=device)
        a = Trace(sg, work, *ours(work)).run()
        b = Trace(sg, work, *sglangs(alloc_classes, sg, work)).run()
        tables_swapped = (Trace(sg, work, sglangs(alloc_classes, sg, work)[0], ours(work)[1]).run(),
                          Trace(sg, work, ours(work)[0], sglangs(alloc_classes, sg, work)[1]).run())
        assert tables_swapped[0].handed_out == a.handed_out and tables_swapped[1].handed_out == b.handed_out, \
            "our request table and SGLang's lead to different indices"
        report(f"page {ps:>2}: {len(a.handed_out)} alloc steps, {sum(map(len, a.handed_out))} tokens, "
               f"{a.evicted_under_pressure} evicted under pressure; pools back to {a.start} (tokens, rows); "
               f"ours vs SGLang's allocator: {compare(a, b)}")
    for ps in page_sizes:
        work, window = Workload(page_size=ps, decode_steps=4 * ps + 5, device=device), ps + 2  # past the window
        a = Trace(sg, work, *ours(work, window), swa_window=window).run()
        b = Trace(sg, work, *sglangs(alloc_classes, sg, work, window), swa_window=window).run()
        report(f"page {ps:>2} SWA (PureSWARadixCache, window {window}): {len(a.handed_out)} alloc steps, "
               f"{a.evicted_under_pressure} evicted under pressure, up to {a.window_freed} window slots freed early; "
               f"pools back to {a.start} (tokens, rows, full, swa); ours vs SGLang's SWA allocator: {compare(a, b)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_reference_src_argument(parser, "sglang/ (SGLang 0.5.23's sources)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for both sides' Triton paths")
    args = parser.parse_args(argv)
    run_all(args.reference_src, device=args.device)


if __name__ == "__main__":
    main()
