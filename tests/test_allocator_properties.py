"""Stateful properties: every allocator against a plain-Python model of its free set.

Random alloc / extend / decode / free (random subsets of what is held) / free groups /
backup / restore / clear. Checked after every step: nothing held is handed out again,
index 0 (page 0) never, available sizes match the model, a restore gives back exactly
the backed-up free set (draining the allocator shows it), and stale states are refused.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcache.testing.allocator_plans import paged_allocator, swa_allocator, token_allocator
from sglang_calls import decode, extend

SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def check_new_locations(
    out: list[int], prefix: list[int], seq: list[int], last: list[int], page_size: int, free: set[int],
) -> tuple[list[list[int]], set[int]]:
    """Split a flat extend/decode result per request and check it against the paging rule.

    A position that starts a page takes a fresh page (free, not taken twice in the
    call); any other position continues right after the previous position's token.
    Returns the per-request chunks and the fresh pages taken.
    """
    chunks: list[list[int]] = []
    fresh: set[int] = set()
    i = 0
    for p, s, prev in zip(prefix, seq, last):
        chunk = out[i:i + s - p]
        i += s - p
        for pos, tok in zip(range(p, s), chunk):
            assert tok % page_size == pos % page_size
            if pos % page_size:
                assert tok == prev + 1
            else:
                page = tok // page_size
                assert page in free and page not in fresh, (page, sorted(free))
                fresh.add(page)
            prev = tok
        chunks.append(chunk)
    assert i == len(out)
    return chunks, fresh


def draw_chosen(data: st.DataObject, requests: list[list[int]]) -> list[int]:
    """Some held requests (their positions in `requests`) to take part in a batch."""
    if not requests:
        return []
    return data.draw(st.lists(st.integers(0, len(requests) - 1), unique=True, max_size=4))


class TokenMachine(RuleBasedStateMachine):
    """TokenToKVPoolAllocator against a set of free indices."""

    @initialize(size=st.integers(16, 200))
    def setup(self, size: int) -> None:
        self.a = token_allocator(size=size, device="cpu", check_frees=True)
        self.everything = set(range(1, size + 1))
        self.free = set(self.everything)
        self.held: set[int] = set()
        self.pending: list[set[int]] | None = None
        self.backup: tuple[Any, set[int], set[int], list[set[int]] | None] | None = None
        self.stale: Any = None

    @rule(n=st.integers(0, 48))
    def alloc(self, n: int) -> None:
        out = self.a.alloc(n)
        if n > len(self.free):
            assert out is None
            return
        assert out is not None and out.dtype == torch.int64
        got = set(out.tolist())
        assert len(got) == n and got <= self.free
        self.free -= got
        self.held |= got

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=32, unique=True))
        self.a.free(t(chosen))
        self.held -= set(chosen)
        if self.pending is not None:
            self.pending.append(set(chosen))
        else:
            self.free |= set(chosen)

    @precondition(lambda self: self.pending is None and self.free)
    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from(sorted(self.free)))
        with pytest.raises(ValueError, match="already free"):
            self.a.free(t([victim]))

    @precondition(lambda self: self.pending is None)
    @rule()
    def group_begin(self) -> None:
        self.a.free_group_begin()
        self.pending = []

    @precondition(lambda self: self.pending is not None)
    @rule()
    def group_end(self) -> None:
        self.a.free_group_end()
        assert self.pending is not None
        for chunk in self.pending:
            self.free |= chunk
        self.pending = None

    @rule()
    def backup_state(self) -> None:
        if self.backup is not None:
            self.stale = self.backup[0]
        self.backup = (self.a.backup_state(), set(self.free), set(self.held), copy.deepcopy(self.pending))

    @precondition(lambda self: self.backup is not None)
    @rule()
    def restore_state(self) -> None:
        assert self.backup is not None
        state, free, held, pending = self.backup
        self.a.restore_state(state)
        self.free, self.held, self.pending = set(free), set(held), copy.deepcopy(pending)

    @precondition(lambda self: self.stale is not None)
    @rule()
    def stale_restore_is_refused(self) -> None:
        with pytest.raises(ValueError, match="not the latest backup"):
            self.a.restore_state(self.stale)

    @rule()
    def clear(self) -> None:
        self.a.clear()
        if self.backup is not None:
            self.stale = self.backup[0]
        self.free, self.held, self.pending, self.backup = set(self.everything), set(), None, None

    @precondition(lambda self: self.pending is None)
    @rule()
    def drain_shows_the_free_set(self) -> None:
        out = self.a.alloc(len(self.free))
        assert out is not None and set(out.tolist()) == self.free
        self.a.free(out)

    @rule(data=st.data())
    def speculate(self, data: st.DataObject) -> None:
        """A draft step: backup, random allocs and frees, restore; the free set must be as before."""
        if self.backup is not None:
            self.stale = self.backup[0]
        state = self.a.backup_state()
        self.backup = (state, set(self.free), set(self.held), copy.deepcopy(self.pending))
        held = set(self.held)
        for alloc_n in data.draw(st.lists(st.integers(0, 24), min_size=1, max_size=4)):
            out = self.a.alloc(alloc_n)
            held |= set(out.tolist()) if out is not None else set()
            if held and data.draw(st.booleans()):
                chosen = data.draw(st.lists(st.sampled_from(sorted(held)), min_size=1, max_size=16, unique=True))
                self.a.free(t(chosen))
                held -= set(chosen)
        self.a.restore_state(state)
        if self.pending is None:
            self.drain_shows_the_free_set()

    @invariant()
    def sizes_match(self) -> None:
        pending = set().union(*self.pending) if self.pending else set()
        assert self.free | self.held | pending == self.everything
        assert len(self.free) + len(self.held) + len(pending) == len(self.everything)
        assert self.a.available_size() == len(self.free)


class PagedMachine(RuleBasedStateMachine):
    """PagedTokenToKVPoolAllocator against a set of free pages and the requests holding the rest."""

    @initialize(pages=st.integers(4, 50), page_size=st.sampled_from([1, 2, 4, 8]))
    def setup(self, pages: int, page_size: int) -> None:
        self.ps = page_size
        self.a = paged_allocator(size=pages * page_size, page_size=page_size, device="cpu",
                                             check_frees=True)
        self.everything = set(range(1, pages + 1))
        self.free = set(self.everything)
        self.requests: list[list[int]] = []  # each request's token indices, in position order
        self.pending: list[set[int]] | None = None
        self.backup: tuple[Any, set[int], list[list[int]], list[set[int]] | None] | None = None
        self.stale: Any = None

    def pages_of(self, tokens: list[int]) -> set[int]:
        return {tok // self.ps for tok in tokens}

    @rule(n=st.integers(0, 6))
    def alloc(self, n: int) -> None:
        out = self.a.alloc(n * self.ps)
        if n > len(self.free):
            assert out is None
            return
        assert out is not None
        rows = out.reshape(n, self.ps)
        assert torch.equal(rows - rows[:, :1], torch.arange(self.ps).expand(n, -1))
        pages = set((rows[:, 0] // self.ps).tolist())
        assert len(pages) == n and pages <= self.free and all(r % self.ps == 0 for r in rows[:, 0].tolist())
        self.free -= pages
        if n:
            self.requests.append(out.tolist())

    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        chosen = draw_chosen(data, self.requests)
        new = data.draw(st.integers(0 if chosen else 1, 3))
        reqs = [self.requests[i] for i in chosen] + [[] for _ in range(new)]
        grow = [data.draw(st.integers(0 if r else 1, 2 * self.ps + 1)) for r in reqs]
        prefix = [len(r) for r in reqs]
        seq = [p + g for p, g in zip(prefix, grow)]
        last = [r[-1] if r else -1 for r in reqs]
        need = sum(-(-s // self.ps) - -(-p // self.ps) for p, s in zip(prefix, seq))
        out = extend(self.a, t(prefix), t(seq), t(last), sum(grow))
        if need > len(self.free):
            assert out is None
            return
        assert out is not None
        chunks, fresh = check_new_locations(out.tolist(), prefix, seq, last, self.ps, self.free)
        assert len(fresh) == need
        self.free -= fresh
        for req, chunk in zip(reqs, chunks):
            req.extend(chunk)
        self.requests.extend(r for r in reqs[len(chosen):] if r)

    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        chosen = draw_chosen(data, self.requests)
        new = data.draw(st.integers(0 if chosen else 1, 3))
        reqs = [self.requests[i] for i in chosen] + [[] for _ in range(new)]
        seq = [len(r) + 1 for r in reqs]
        last = [r[-1] if r else -1 for r in reqs]
        need = sum(1 for s in seq if (s - 1) % self.ps == 0)
        out = decode(self.a, t(seq), t(last))
        if need > len(self.free):
            assert out is None
            return
        assert out is not None
        chunks, fresh = check_new_locations(out.tolist(), [s - 1 for s in seq], seq, last, self.ps, self.free)
        assert len(fresh) == need
        self.free -= fresh
        for req, chunk in zip(reqs, chunks):
            req.extend(chunk)
        self.requests.extend(reqs[len(chosen):])

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free_requests(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.integers(0, len(self.requests) - 1), min_size=1, max_size=4, unique=True))
        tokens = [tok for i in chosen for tok in self.requests[i]]
        tokens = data.draw(st.permutations(tokens))
        self.a.free(t(tokens))
        pages = self.pages_of(tokens)
        self.requests = [r for i, r in enumerate(self.requests) if i not in chosen]
        if self.pending is not None:
            self.pending.append(pages)
        else:
            self.free |= pages

    @precondition(lambda self: self.pending is None and self.free)
    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        page = data.draw(st.sampled_from(sorted(self.free)))
        with pytest.raises(ValueError, match=f"double free: page {page} is already free"):
            self.a.free(t([page * self.ps]))

    @precondition(lambda self: self.pending is None)
    @rule()
    def group_begin(self) -> None:
        self.a.free_group_begin()
        self.pending = []

    @precondition(lambda self: self.pending is not None)
    @rule()
    def group_end(self) -> None:
        self.a.free_group_end()
        assert self.pending is not None
        for pages in self.pending:
            self.free |= pages
        self.pending = None

    @rule()
    def backup_state(self) -> None:
        if self.backup is not None:
            self.stale = self.backup[0]
        self.backup = (self.a.backup_state(), set(self.free), copy.deepcopy(self.requests),
                       copy.deepcopy(self.pending))

    @precondition(lambda self: self.backup is not None)
    @rule()
    def restore_state(self) -> None:
        assert self.backup is not None
        state, free, requests, pending = self.backup
        self.a.restore_state(state)
        self.free, self.requests, self.pending = set(free), copy.deepcopy(requests), copy.deepcopy(pending)

    @precondition(lambda self: self.stale is not None)
    @rule()
    def stale_restore_is_refused(self) -> None:
        with pytest.raises(ValueError, match="not the latest backup"):
            self.a.restore_state(self.stale)

    @rule()
    def clear(self) -> None:
        self.a.clear()
        if self.backup is not None:
            self.stale = self.backup[0]
        self.free, self.requests, self.pending, self.backup = set(self.everything), [], None, None

    @precondition(lambda self: self.pending is None)
    @rule()
    def drain_shows_the_free_set(self) -> None:
        out = self.a.alloc(len(self.free) * self.ps)
        assert out is not None and self.pages_of(out.tolist()) == self.free
        self.a.free(out)

    @rule(data=st.data())
    def speculate(self, data: st.DataObject) -> None:
        """A draft step: backup, random allocs, decodes and frees, restore; the free set must be as before."""
        if self.backup is not None:
            self.stale = self.backup[0]
        state = self.a.backup_state()
        self.backup = (state, set(self.free), copy.deepcopy(self.requests), copy.deepcopy(self.pending))
        held = [list(r) for r in self.requests]
        for pages in data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=4)):
            out = self.a.alloc(pages * self.ps)
            if out is not None and pages:
                held.append(out.tolist())
            if held and data.draw(st.booleans()):
                out = decode(self.a, t([len(r) + 1 for r in held]), t([r[-1] for r in held]))
                for r, tok in zip(held, out.tolist() if out is not None else []):
                    r.append(tok)
            if held and data.draw(st.booleans()):
                gone = data.draw(st.lists(st.integers(0, len(held) - 1), min_size=1, max_size=3, unique=True))
                self.a.free(t([tok for i in gone for tok in held[i]]))
                held = [r for i, r in enumerate(held) if i not in gone]
        self.a.restore_state(state)
        if self.pending is None:
            self.drain_shows_the_free_set()

    @invariant()
    def sizes_match(self) -> None:
        held = [self.pages_of(r) for r in self.requests] + list(self.pending or [])
        assert sum(len(h) for h in held) + len(self.free) == len(self.everything)
        assert self.free.union(*held) == self.everything
        assert self.a.available_size() == len(self.free) * self.ps


class SWAMachine(RuleBasedStateMachine):
    """SWATokenToKVPoolAllocator against free page sets for both sides and a dict for the map."""

    @initialize(full_pages=st.integers(8, 40), swa_pages=st.integers(4, 20), page_size=st.sampled_from([1, 4]))
    def setup(self, full_pages: int, swa_pages: int, page_size: int) -> None:
        self.ps = page_size
        self.a = swa_allocator(full_size=full_pages * page_size, swa_size=swa_pages * page_size,
                                           page_size=page_size, device="cpu", check_frees=True)
        self.all_full, self.all_swa = set(range(1, full_pages + 1)), set(range(1, swa_pages + 1))
        self.full_free, self.swa_free = set(self.all_full), set(self.all_swa)
        self.mapping: dict[int, int] = {}
        self.requests: list[list[int]] = []
        self.pending: list[set[int]] | None = None  # full pages whose free is deferred
        self.pending_swa: set[int] = set()  # SWA pages unmapped in the open group, released at its end
        self.backup: tuple[Any, ...] | None = None
        self.stale: Any = None

    def pages_of(self, tokens: list[int]) -> set[int]:
        return {tok // self.ps for tok in tokens}

    def room(self) -> int:
        return min(len(self.full_free), len(self.swa_free))

    def take(self, full: list[int], swa: list[int]) -> None:
        """The model of alloc: fresh, offset-aligned SWA pages, one per full page."""
        assert [s % self.ps for s in swa] == [f % self.ps for f in full]
        swa_pages = self.pages_of(swa)
        assert len(swa_pages) == len(self.pages_of(full)) and swa_pages <= self.swa_free
        self.swa_free -= swa_pages
        self.mapping.update(zip(full, swa))

    def unmap_pages(self, full_pages: set[int]) -> None:
        """The model of releasing the SWA side of whole full pages (SGLang 0.5.23: the map is cleared
        at once, the SWA pages return at the free group's end)."""
        for tok in [tok for tok in self.mapping if tok // self.ps in full_pages]:
            (self.swa_free if self.pending is None else self.pending_swa).add(self.mapping.pop(tok) // self.ps)

    @rule(n=st.integers(0, 5))
    def alloc(self, n: int) -> None:
        out = self.a.alloc(n * self.ps)
        if n > self.room():
            assert out is None
            return
        assert out is not None
        full = out.tolist()
        pages = self.pages_of(full)
        assert len(pages) == n and pages <= self.full_free
        swa = self.a.translate_loc_from_full_to_swa(out).tolist()
        self.full_free -= pages
        self.take(full, swa)
        if n:
            self.requests.append(full)

    def grow(self, reqs: list[list[int]], prefix: list[int], seq: list[int], out: torch.Tensor | None) -> bool:
        last = [r[-1] if r else -1 for r in reqs]
        need = sum(-(-s // self.ps) - -(-p // self.ps) for p, s in zip(prefix, seq))
        if need > self.room():
            assert out is None
            return False
        assert out is not None
        chunks, fresh = check_new_locations(out.tolist(), prefix, seq, last, self.ps, self.full_free)
        swa_last = [self.mapping.get(x, -1) for x in last]
        swa = self.a.translate_loc_from_full_to_swa(out).tolist()
        _, swa_fresh = check_new_locations(swa, prefix, seq, swa_last, self.ps, self.swa_free)
        assert len(fresh) == len(swa_fresh) == need
        self.full_free -= fresh
        self.swa_free -= swa_fresh
        self.mapping.update(zip(out.tolist(), swa))
        for req, chunk in zip(reqs, chunks):
            req.extend(chunk)
        return True

    @precondition(lambda self: self.ps > 1)
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        chosen = draw_chosen(data, self.requests)
        new = data.draw(st.integers(0 if chosen else 1, 2))
        reqs = [self.requests[i] for i in chosen] + [[] for _ in range(new)]
        grow = [data.draw(st.integers(0 if r else 1, 2 * self.ps + 1)) for r in reqs]
        prefix = [len(r) for r in reqs]
        seq = [p + g for p, g in zip(prefix, grow)]
        out = extend(self.a, t(prefix), t(seq), t([r[-1] if r else -1 for r in reqs]), sum(grow))
        if self.grow(reqs, prefix, seq, out):
            self.requests.extend(r for r in reqs[len(chosen):] if r)

    @precondition(lambda self: self.ps > 1)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        chosen = draw_chosen(data, self.requests)
        new = data.draw(st.integers(0 if chosen else 1, 2))
        reqs = [self.requests[i] for i in chosen] + [[] for _ in range(new)]
        seq = [len(r) + 1 for r in reqs]
        out = decode(self.a, t(seq), t([r[-1] if r else -1 for r in reqs]))
        if self.grow(reqs, [s - 1 for s in seq], seq, out):
            self.requests.extend(reqs[len(chosen):])

    @precondition(lambda self: any(len(self.pages_of(r)) > 1 for r in self.requests))
    @rule(data=st.data())
    def slide_window(self, data: st.DataObject) -> None:
        """free_swa some tokens of a request's pages before its last page (always page-granular)."""
        long = [r for r in self.requests if len(self.pages_of(r)) > 1]
        req = data.draw(st.sampled_from(long))
        keep = req[-1] // self.ps
        old = [tok for tok in req if tok // self.ps != keep]
        tokens = data.draw(st.lists(st.sampled_from(old), min_size=1, max_size=8))
        self.a.free_swa(t(tokens))
        self.unmap_pages(self.pages_of(tokens))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free_requests(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.integers(0, len(self.requests) - 1), min_size=1, max_size=3, unique=True))
        tokens = data.draw(st.permutations([tok for i in chosen for tok in self.requests[i]]))
        self.a.free(t(tokens))
        self.requests = [r for i, r in enumerate(self.requests) if i not in chosen]
        pages = self.pages_of(tokens)
        self.unmap_pages(pages)
        if self.pending is not None:
            self.pending.append(pages)
        else:
            self.full_free |= pages

    @precondition(lambda self: self.pending is None)
    @rule()
    def group_begin(self) -> None:
        self.a.free_group_begin()
        self.pending = []

    @precondition(lambda self: self.pending is not None)
    @rule()
    def group_end(self) -> None:
        self.a.free_group_end()
        assert self.pending is not None
        self.full_free |= set().union(*self.pending)
        self.swa_free |= self.pending_swa
        self.pending, self.pending_swa = None, set()

    @precondition(lambda self: self.pending is None and self.full_free)
    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        page = data.draw(st.sampled_from(sorted(self.full_free)))
        with pytest.raises(ValueError, match="already free"):
            self.a.free(t([page * self.ps]))

    @rule()
    def backup_state(self) -> None:
        if self.backup is not None:
            self.stale = self.backup[0]
        self.backup = (self.a.backup_state(), set(self.full_free), set(self.swa_free), dict(self.mapping),
                       copy.deepcopy(self.requests), copy.deepcopy(self.pending), set(self.pending_swa))

    @precondition(lambda self: self.backup is not None)
    @rule()
    def restore_state(self) -> None:
        assert self.backup is not None
        state, full_free, swa_free, mapping, requests, pending, pending_swa = self.backup
        self.a.restore_state(state)
        self.full_free, self.swa_free, self.mapping = set(full_free), set(swa_free), dict(mapping)
        self.requests, self.pending, self.pending_swa = copy.deepcopy(requests), copy.deepcopy(pending), set(pending_swa)

    @precondition(lambda self: self.stale is not None)
    @rule()
    def stale_restore_is_refused(self) -> None:
        with pytest.raises(ValueError, match="not the latest backup"):
            self.a.restore_state(self.stale)

    @rule()
    def clear(self) -> None:
        self.a.clear()
        if self.backup is not None:
            self.stale = self.backup[0]
        self.full_free, self.swa_free, self.mapping = set(self.all_full), set(self.all_swa), {}
        self.requests, self.pending, self.backup, self.pending_swa = [], None, None, set()

    @precondition(lambda self: self.pending is None and self.room())
    @rule()
    def drain_shows_the_free_sets(self) -> None:
        n = self.room()
        out = self.a.alloc(n * self.ps)
        assert out is not None
        full_pages = self.pages_of(out.tolist())
        swa_pages = self.pages_of(self.a.translate_loc_from_full_to_swa(out).tolist())
        assert full_pages <= self.full_free and swa_pages <= self.swa_free
        if len(self.full_free) == n:
            assert full_pages == self.full_free
        if len(self.swa_free) == n:
            assert swa_pages == self.swa_free
        self.a.free(out)

    @rule(data=st.data())
    def speculate(self, data: st.DataObject) -> None:
        """A draft step: backup, random allocs, window slides and frees, restore; sets and map as before."""
        if self.backup is not None:
            self.stale = self.backup[0]
        state = self.a.backup_state()
        self.backup = (state, set(self.full_free), set(self.swa_free), dict(self.mapping),
                       copy.deepcopy(self.requests), copy.deepcopy(self.pending), set(self.pending_swa))
        held = [list(r) for r in self.requests]
        for pages in data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4)):
            out = self.a.alloc(pages * self.ps)
            if out is not None and pages:
                held.append(out.tolist())
            if held and data.draw(st.booleans()):
                req = data.draw(st.sampled_from(held))
                self.a.free_swa(t([tok for tok in req if tok // self.ps != req[-1] // self.ps]))
            if held and data.draw(st.booleans()):
                gone = data.draw(st.lists(st.integers(0, len(held) - 1), min_size=1, max_size=3, unique=True))
                self.a.free(t([tok for i in gone for tok in held[i]]))
                held = [r for i, r in enumerate(held) if i not in gone]
        self.a.restore_state(state)
        if self.pending is None and self.room():
            self.drain_shows_the_free_sets()

    @invariant()
    def sizes_and_map_match(self) -> None:
        assert self.a.full_available_size() == len(self.full_free) * self.ps
        assert self.a.swa_available_size() == len(self.swa_free) * self.ps
        assert self.a.available_size() == self.room() * self.ps
        table = self.a.full_to_swa_index_mapping
        rows = torch.nonzero(table[:-1]).reshape(-1)
        assert dict(zip(rows.tolist(), table[rows].tolist())) == self.mapping and int(table[-1]) == -1
        held_swa = self.pages_of(list(self.mapping.values()))
        assert not held_swa & self.swa_free and held_swa | self.swa_free | self.pending_swa == self.all_swa


TestTokenAllocator = TokenMachine.TestCase
TestTokenAllocator.settings = SETTINGS
TestPagedAllocator = PagedMachine.TestCase
TestPagedAllocator.settings = SETTINGS
TestSWAAllocator = SWAMachine.TestCase
TestSWAAllocator.settings = SETTINGS
