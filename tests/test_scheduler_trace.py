"""A scheduler-shaped trace through the pools and allocators, with exactly the calls SGLang 0.5.23 makes.

A small radix tree (below; SGLang's RadixCache is not a dependency) and a scheduler loop
drive ReqToTokenPool and the allocators through a seeded workload: requests sharing
system prompts arrive, match cached prefixes, prefill in chunks (checkpointing each
chunk into the tree), decode, finish inside free groups, and the tree evicts under
pressure. After every step a census checks that every KV page is held exactly once --
by the tree, by a running request's own rows, or by the free list -- and that no row
holds index 0. At the end, with every request finished and the tree evicted,
available_size() is what it was at the start. The SWA case runs the same loop without
prefix sharing (SGLang's chunk cache) and slides each request's window with
free_swa_segment, then releases rows with free_full_segments / free_segments as
SGLang's free_kv_row_segments does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from kvcache.allocators import SWATokenToKVPoolAllocator
from kvcache.pools import ReqToTokenPool
from kvcache.sizing.pool_config import request_table_slot
from kvcache.testing.allocator_plans import paged_allocator, swa_allocator, token_allocator

CPU = torch.device("cpu")
CHUNK = 48  # chunked-prefill budget per request and step
STEPS = 70


@dataclass
class KVRecord:
    """SGLang 0.5.23's req.kv: the row a request holds."""

    req_pool_idx: int | None = None


@dataclass
class Req:
    tokens: list[int]
    prompt_len: int
    max_new: int
    kv: KVRecord = field(default_factory=KVRecord)
    seq_len: int = 0  # tokens whose KV is allocated: tokens[:seq_len]
    protected: int = 0  # cache_protected_len: row[:protected] belongs to the tree
    node: Node | None = None
    swa_evicted: int = 0  # row[:swa_evicted] has no SWA slots any more

    @property
    def prefilled(self) -> bool:
        return self.seq_len >= self.prompt_len

    @property
    def finished(self) -> bool:
        return self.seq_len >= self.prompt_len + self.max_new


class Node:
    def __init__(self, key: list[int], value: torch.Tensor, parent: Node | None) -> None:
        self.key, self.value, self.parent = key, value, parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.lock = 0
        self.last_access = 0


class MiniRadixCache:
    """Page-aligned keys; values are int64 copies of rows; frees through free_segment, like SGLang's RadixCache."""

    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: Any, page_size: int) -> None:
        self.req_to_token_pool, self.allocator, self.page_size = req_to_token_pool, allocator, page_size
        self.root = Node([], torch.empty(0, dtype=torch.int64), None)
        self.root.lock = 1
        self.clock = self.evicted_for_alloc = 0

    def supports_prefix_sharing(self) -> bool:
        return True

    def _first(self, key: list[int]) -> tuple[int, ...]:
        return tuple(key[: self.page_size])

    def _split(self, node: Node, at: int) -> Node:
        """Cut node at `at` tokens (page-aligned); the returned upper half keeps the parent link."""
        assert node.parent is not None
        upper = Node(node.key[:at], node.value[:at], node.parent)
        upper.lock, upper.last_access = node.lock, node.last_access
        node.parent.children[self._first(node.key)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._first(node.key)] = node
        return upper

    def _common(self, a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n // self.page_size * self.page_size

    def match_prefix(self, key: list[int]) -> tuple[torch.Tensor, Node]:
        key = key[: len(key) // self.page_size * self.page_size]
        node, values = self.root, []
        self.clock += 1
        while key and self._first(key) in node.children:
            child = node.children[self._first(key)]
            n = self._common(child.key, key)
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = self.clock
            values.append(child.value)
            node, key = child, key[n:]
        return (torch.cat(values) if values else torch.empty(0, dtype=torch.int64)), node

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Add key -> value; returns how many leading tokens the tree already had (their new copies are duplicates)."""
        node, done = self.root, 0
        while done < len(key):
            rest = key[done:]
            child = node.children.get(self._first(rest))
            n = self._common(child.key, rest) if child is not None else 0
            if child is None or n == 0:
                node.children[self._first(rest)] = Node(rest, value[done:].clone(), node)
                return done
            if n < len(child.key):
                child = self._split(child, n)
            node, done = child, done + n
        return done

    def lock(self, node: Node) -> None:
        while node is not self.root:
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node | None) -> None:
        while node is not None and node is not self.root:
            node.lock -= 1
            assert node.lock >= 0
            node = node.parent

    def _leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not self.root and not n.children and n.lock == 0:
                out.append(n)
        return out

    def evictable_size(self) -> int:
        total, stack = 0, [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            total += len(n.key) if n is not self.root and n.lock == 0 else 0
        return total

    def evict(self, num_tokens: int) -> int:
        evicted = 0
        while evicted < num_tokens:
            leaves = sorted(self._leaves(), key=lambda n: n.last_access)
            if not leaves:
                break
            leaf = leaves[0]
            self.allocator.free_segment(leaf.value, start_pos=0)  # tree values are page-exact row copies
            assert leaf.parent is not None
            del leaf.parent.children[self._first(leaf.key)]
            evicted += len(leaf.key)
        return evicted

    def evict_for_alloc(self, params: Any) -> None:
        self.evicted_for_alloc += self.evict(params.num_tokens)

    def values(self) -> list[torch.Tensor]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            out.append(n.value)
        return out

    def checkpoint(self, req: Req, up_to: int) -> None:
        """SGLang's _insert_cache + checkpoint: insert the row, free its duplicates, point the row at the tree."""
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        key_len = up_to // self.page_size * self.page_size
        prefix_len = self.insert(req.tokens[:key_len], row[:key_len].to(torch.int64, copy=True))
        self.allocator.free_segment(row[req.protected:prefix_len], start_pos=req.protected)
        indices, node = self.match_prefix(req.tokens[:key_len])
        assert indices.numel() == key_len
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(req.protected, key_len)), indices[req.protected:])
        req.protected = key_len
        self.unlock(req.node)
        self.lock(node)
        req.node = node


class Scheduler:
    """The loop: admit, extend a chunk, decode, release finished requests in a free group."""

    def __init__(self, allocator: Any, page_size: int, *, radix: bool, window: int | None, seed: int) -> None:
        self.allocator, self.page_size, self.window = allocator, page_size, window
        self.rng = random.Random(seed)
        self.pool = ReqToTokenPool(slot=request_table_slot(12, 512), device=CPU)
        self.tree = MiniRadixCache(self.pool, allocator, page_size) if radix else None
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.finished = self.matched = self.evicted = self.chunks = 0
        self.prompts = [[self.rng.randrange(1000) for _ in range(self.rng.randrange(20, 90))] for _ in range(3)]

    def new_request(self) -> Req:
        tokens = list(self.rng.choice(self.prompts)) + [self.rng.randrange(1000) for _ in range(self.rng.randrange(1, 60))]
        return Req(tokens=tokens, prompt_len=len(tokens), max_new=self.rng.randrange(1, 40))

    def _reserve(self, req: Req) -> int:
        return req.prompt_len + req.max_new + 2 * self.page_size

    def _admissible(self, req: Req) -> bool:
        reserved = sum(self._reserve(r) for r in self.running) + self._reserve(req)
        if reserved > self.allocator.size_full - self.page_size or not self.pool.available_size():
            return False
        if self.window is None:
            return True
        per_request = self.window + CHUNK + 3 * self.page_size
        return (len(self.running) + 1) * per_request <= self.allocator.size_swa

    def step(self, arrivals: bool = True) -> None:
        for _ in range(self.rng.randrange(0, 3) if arrivals else 0):
            self.waiting.append(self.new_request())
        while self.waiting and self._admissible(self.waiting[0]):
            self.admit(self.waiting.pop(0))
        extending = [r for r in self.running if not r.prefilled]
        if extending:
            self.extend(extending)
        decoding = [r for r in self.running if r.prefilled and r not in extending and not r.finished]
        if decoding:
            self.decode(decoding)
        self.slide_windows()
        done = [r for r in self.running if r.finished]
        if done:
            self.allocator.free_group_begin()
            for req in done:
                self.release(req)
            self.finished += len(done)
            self.allocator.free_group_end()
            self.running = [r for r in self.running if not r.finished]

    def admit(self, req: Req) -> None:
        prefix = torch.empty(0, dtype=torch.int64)
        if self.tree is not None:
            prefix, node = self.tree.match_prefix(req.tokens[: req.prompt_len - 1])
            self.matched += prefix.numel()
            self.tree.lock(node)
            req.node = node
        assert self.pool.alloc([req]) == [req.kv.req_pool_idx]
        self.pool.write((req.kv.req_pool_idx, slice(0, prefix.numel())), prefix)
        req.seq_len = req.protected = prefix.numel()
        self.running.append(req)

    def _alloc(self, demand: int, paged_call: Any, tokens: int) -> torch.Tensor:
        self.allocator.evict_to_free_tokens(self.tree, demand)
        out = self.allocator.alloc(tokens) if self.page_size == 1 else paged_call()
        assert out is not None, f"out of KV slots for {tokens} tokens"
        return out

    def _last_loc(self, reqs: list[Req]) -> torch.Tensor:
        rows = torch.tensor([r.kv.req_pool_idx for r in reqs])
        pos = torch.tensor([r.seq_len - 1 for r in reqs])
        last = self.pool.req_to_token[rows, pos.clamp(min=0)].to(torch.int64)
        return torch.where(pos >= 0, last, torch.full_like(last, -1))

    def extend(self, reqs: list[Req]) -> None:
        prefix_cpu = torch.tensor([r.seq_len for r in reqs])
        seq_cpu = torch.tensor([min(r.prompt_len, r.seq_len + CHUNK) for r in reqs])
        tokens = int((seq_cpu - prefix_cpu).sum())
        last = self._last_loc(reqs)
        out = self._alloc(tokens + len(reqs) * self.page_size, lambda: self.allocator.alloc_extend(
            prefix_cpu.clone(), prefix_cpu, seq_cpu.clone(), seq_cpu, last, tokens), tokens)
        start = 0
        for req, lo, hi in zip(reqs, prefix_cpu.tolist(), seq_cpu.tolist()):
            self.pool.write((req.kv.req_pool_idx, slice(lo, hi)), out[start:start + hi - lo])
            start += hi - lo
            req.seq_len = hi
            if not req.prefilled and self.tree is not None:
                self.tree.checkpoint(req, req.seq_len)  # a chunk of a long prompt joins the tree
                self.chunks += 1

    def decode(self, reqs: list[Req]) -> None:
        for req in reqs:
            req.tokens.append(self.rng.randrange(1000))
        seq_cpu = torch.tensor([r.seq_len + 1 for r in reqs])
        last = self._last_loc(reqs)
        out = self._alloc(len(reqs) * self.page_size,
                          lambda: self.allocator.alloc_decode(seq_cpu.clone(), seq_cpu, last), len(reqs))
        rows = torch.tensor([r.kv.req_pool_idx for r in reqs])
        self.pool.write((rows, seq_cpu - 1), out.to(torch.int32))
        for req in reqs:
            req.seq_len += 1

    def slide_windows(self) -> None:
        """SGLang's free_swa_out_of_window_slots without prefix sharing: keep the last `window` tokens' SWA slots."""
        if self.window is None:
            return
        for req in self.running:
            new = (req.seq_len - self.window) // self.page_size * self.page_size
            if new > req.swa_evicted:
                row = self.pool.req_to_token[req.kv.req_pool_idx]
                self.allocator.free_swa_segment(row[req.swa_evicted:new], start_pos=req.swa_evicted)
                req.swa_evicted = new

    def release(self, req: Req) -> None:
        """SGLang's release_kv_cache: checkpoint into the tree, free the row's own part, unlock, free the row."""
        if self.tree is not None:
            self.tree.checkpoint(req, req.seq_len)
        row = self.pool.req_to_token[req.kv.req_pool_idx]
        if self.window is not None and req.swa_evicted > req.protected:
            self.allocator.free_full_segments([(row[req.protected:req.swa_evicted], req.protected)])
            self.allocator.free_segments([(row[req.swa_evicted:req.seq_len], req.swa_evicted)])
        else:
            self.allocator.free_segments([(row[req.protected:req.seq_len], req.protected)])
        if self.tree is not None:
            self.tree.unlock(req.node)
        self.pool.free(req)
        assert req.kv.req_pool_idx is None

    def drain(self) -> None:
        """Finish everything without new arrivals, then evict the whole tree."""
        while self.running or self.waiting:
            self.step(arrivals=False)
        if self.tree is not None:
            self.tree.evict(1 << 30)


def pages_of(indices: torch.Tensor, page_size: int) -> list[int]:
    """The pages a run of a row covers (the first index of each page names it)."""
    return (indices[::page_size].to(torch.int64) // page_size).tolist()


def census(s: Scheduler) -> None:
    """Every page is held once: by the tree, by a running request's own rows, or by the free list; no 0 anywhere."""
    ps, a = s.page_size, s.allocator
    full = a.full_attn_allocator if isinstance(a, SWATokenToKVPoolAllocator) else a
    held: list[int] = []
    if s.tree is not None:
        for value in s.tree.values():
            held += pages_of(value, ps)
    for req in s.running:
        row = s.pool.req_to_token[req.kv.req_pool_idx, : req.seq_len]
        assert int(row.min()) > 0 if req.seq_len else True, "a row holds index 0"
        assert len(set(row.tolist())) == req.seq_len, "a row holds an index twice"
        held += pages_of(row[req.protected:], ps)
    free = full.get_all_free_pages().tolist()
    pages = held + free
    assert 0 not in pages
    assert sorted(pages) == list(range(1, full.size // ps + 1)), "a page is lost or held twice"
    if isinstance(a, SWATokenToKVPoolAllocator):
        swa_held: list[int] = []
        for req in s.running:
            live = s.pool.req_to_token[req.kv.req_pool_idx, req.swa_evicted: req.seq_len]
            swa_held += pages_of(a.translate_loc_from_full_to_swa(live), ps)
        swa_pages = swa_held + a.swa_attn_allocator.get_all_free_pages().tolist()
        assert sorted(swa_pages) == list(range(1, a.size_swa // ps + 1)), "an SWA page is lost or held twice"


def run_trace(allocator: Any, page_size: int, *, radix: bool, window: int | None = None, seed: int = 7) -> Scheduler:
    start = allocator.available_size()
    s = Scheduler(allocator, page_size, radix=radix, window=window, seed=seed)
    for _ in range(STEPS):
        s.step()
        census(s)
    finished_while_busy = s.finished
    s.drain()
    census(s)
    assert finished_while_busy > 5, "the trace should finish requests while others run"
    assert allocator.available_size() == start
    assert s.pool.available_size() == s.pool.size
    return s


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_trace_loses_and_duplicates_nothing(page_size: int) -> None:
    size = 1024 if page_size == 1 else 2048
    allocator: Any = (token_allocator(size=size, device=CPU, check_frees=True) if page_size == 1 else
                      paged_allocator(size=size, page_size=page_size, device=CPU, check_frees=True))
    s = run_trace(allocator, page_size, radix=True)
    assert s.tree is not None and s.tree.values() == [s.tree.root.value]  # drained: only the root
    # the workload did what it is for: prefix hits, chunked prompts, eviction to make room
    assert s.matched > 0 and s.chunks > 0 and s.tree.evicted_for_alloc > 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_sliding_window_trace_loses_and_duplicates_nothing(page_size: int) -> None:
    full = 1024 if page_size == 1 else 2048
    allocator = swa_allocator(full_size=full, swa_size=full // 2, page_size=page_size, device=CPU,
                                          check_frees=True)
    run_trace(allocator, page_size, radix=False, window=32)
