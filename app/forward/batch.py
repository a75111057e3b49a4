"""DecodeBatch and ExtendBatch (what one decode or prefill step reads) and DecodeRequests (a minimal scheduler).

The scheduler does what SGLang's does: a decode step takes one new KV slot per running
request from the allocator (token-level, or the next slot of the request's last page); an
extend (prefill) step takes a slot for each new token after the request's prefix
(`alloc_extend` when paged). The slots are written into the request's row of req_to_token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from kvcache.errors import KVCacheError
from kvcache.pools import ReqToTokenPool


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """One decode step for bs requests: each feeds one token and attends to its first seq_lens[i] positions."""

    input_ids: torch.Tensor  # int64 [bs]
    positions: torch.Tensor  # int64 [bs]: seq_lens - 1
    req_pool_indices: torch.Tensor  # int64 [bs]: rows of req_to_token
    seq_lens: torch.Tensor  # int32 [bs], the new token included
    out_cache_loc: torch.Tensor  # int64 [bs]: the KV slot the new token is written to

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def logit_rows(self) -> None:
        """Every token's logits (one token per request)."""
        return None


@dataclass(frozen=True, slots=True)
class ExtendBatch:
    """One prefill (extend) step: request i already holds prefix_lens_cpu[i] tokens in the pools and feeds
    extend_lens_cpu[i] new ones, flat in request order; its new tokens attend causally to prefix + new."""

    input_ids: torch.Tensor  # int64 [tokens]
    positions: torch.Tensor  # int64 [tokens]: prefix_len + 0 .. seq_len - 1, per request
    req_pool_indices: torch.Tensor  # int64 [bs]
    seq_lens: torch.Tensor  # int32 [bs]: prefix + new
    out_cache_loc: torch.Tensor  # int64 [tokens]: the KV slot each new token is written to
    rows_cpu: tuple[int, ...]  # the host's copies: attention loops over requests without a device sync
    prefix_lens_cpu: tuple[int, ...]
    extend_lens_cpu: tuple[int, ...]
    logit_rows: torch.Tensor | None  # which tokens get logits: each request's last (None: all, for logprobs)

    @property
    def batch_size(self) -> int:
        return len(self.rows_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def requests(self) -> list[tuple[int, int, int, int]]:
        """(row, prefix length, first token in the flat batch, new tokens) per request."""
        starts = [0]
        for n in self.extend_lens_cpu[:-1]:
            starts.append(starts[-1] + n)
        return list(zip(self.rows_cpu, self.prefix_lens_cpu, starts, self.extend_lens_cpu))


class OutOfKVSlotsError(KVCacheError):
    """The allocator has no free slot for the next decode token."""


class ContextFullError(KVCacheError):
    """A decode step would write past the end of a request's req_to_token row."""


class UnknownRequestError(KVCacheError):
    """A decode step or release names a request-table row that no running request holds, or one row twice."""


class DecodeRequests:
    """Running requests over a ReqToTokenPool and a token or paged allocator (host-side lengths)."""

    def __init__(self, *, req_to_token_pool: ReqToTokenPool, allocator: Any, device: torch.device) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.device = device
        self.seq_lens: dict[int, int] = {}

    def add(self, count: int) -> list[int]:
        """Start `count` empty requests; their request-table rows."""
        rows = self.req_to_token_pool.alloc(count)
        if rows is None:
            raise OutOfKVSlotsError(f"no {count} free request rows (max_running_requests)")
        for row in rows:
            self.seq_lens[row] = 0
        return rows

    def step(self, rows: Sequence[int], input_ids: torch.Tensor) -> DecodeBatch:
        """The next decode batch for `rows`: a fresh KV slot each, recorded in req_to_token."""
        rows = self._running(rows)
        new_lens = [self.seq_lens[r] + 1 for r in rows]
        width = self.req_to_token_pool.max_context_len
        if max(new_lens, default=0) > width:  # checked before any slot is taken, so a refused step holds nothing
            raise ContextFullError(f"a request would reach {max(new_lens)} tokens, past its request-table row of "
                                   f"{width} token slots; release it or raise --context-length")
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        seq = torch.tensor(new_lens, dtype=torch.int64, device=self.device)
        loc = self._allocate(index, seq, torch.tensor(new_lens, dtype=torch.int64))
        table = self.req_to_token_pool.req_to_token
        table[index, seq - 1] = loc.to(torch.int32)
        for r, n in zip(rows, new_lens):
            self.seq_lens[r] = n
        return DecodeBatch(input_ids=input_ids.to(self.device, torch.int64), positions=seq - 1, req_pool_indices=index,
                           seq_lens=seq.to(torch.int32), out_cache_loc=loc)

    def extend(self, rows: Sequence[int], input_ids: Sequence[torch.Tensor], *,
               all_logits: bool = False) -> ExtendBatch:
        """The next prefill batch: request rows[i] feeds input_ids[i] after the tokens it holds; a KV slot
        per new token, recorded in req_to_token. all_logits asks for every token's logits (logprobs)."""
        rows = self._running(rows)
        if len(input_ids) != len(rows):
            raise ValueError(f"{len(rows)} requests but {len(input_ids)} token lists")
        prefix = [self.seq_lens[r] for r in rows]
        new = [int(ids.numel()) for ids in input_ids]
        if min(new, default=1) < 1:
            raise ValueError("every request of an extend step feeds at least one token")
        seq = [p + n for p, n in zip(prefix, new)]
        width = self.req_to_token_pool.max_context_len
        if max(seq, default=0) > width:  # checked before any slot is taken
            raise ContextFullError(f"a request would reach {max(seq)} tokens, past its request-table row of "
                                   f"{width} token slots; release it or raise --context-length")
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        loc = self._allocate_extend(index, prefix, seq)
        table = self.req_to_token_pool.req_to_token
        positions = torch.cat([torch.arange(p, s, dtype=torch.int64) for p, s in zip(prefix, seq)]).to(self.device)
        flat_rows = torch.repeat_interleave(index, torch.tensor(new, device=self.device))
        table[flat_rows, positions] = loc.to(torch.int32)
        for r, n in zip(rows, seq):
            self.seq_lens[r] = n
        last = torch.tensor(new, dtype=torch.int64).cumsum(0).sub(1).to(self.device)  # each request's last token
        return ExtendBatch(
            input_ids=torch.cat([ids.reshape(-1) for ids in input_ids]).to(self.device, torch.int64),
            positions=positions, req_pool_indices=index, seq_lens=torch.tensor(seq, dtype=torch.int32, device=self.device),
            out_cache_loc=loc, rows_cpu=tuple(rows), prefix_lens_cpu=tuple(prefix), extend_lens_cpu=tuple(new),
            logit_rows=None if all_logits else last)

    def _allocate_extend(self, index: torch.Tensor, prefix: list[int], seq: list[int]) -> torch.Tensor:
        total = sum(seq) - sum(prefix)
        if self.allocator.page_size == 1:
            loc = self.allocator.alloc(total)
        else:
            table = self.req_to_token_pool.req_to_token
            prefix_t = torch.tensor(prefix, dtype=torch.int64)
            seq_t = torch.tensor(seq, dtype=torch.int64)
            prefix_dev = prefix_t.to(self.device)
            last = table[index, (prefix_dev - 1).clamp(min=0)].to(torch.int64)
            last = torch.where(prefix_dev > 0, last, torch.full_like(last, -1))
            loc = self.allocator.alloc_extend(prefix_dev, prefix_t, seq_t.to(self.device), seq_t, last, total)
        if loc is None:
            raise OutOfKVSlotsError(f"the KV allocator has no free slots for {total} more tokens")
        return loc.to(torch.int64)

    def _running(self, rows: Sequence[int]) -> list[int]:
        """`rows` as a list, each held by a running request and named once (else UnknownRequestError naming it)."""
        rows = list(rows)
        seen: set[int] = set()
        for r in rows:
            if r in seen:  # one request, one token per step and one release
                raise UnknownRequestError(f"request row {r} is named twice; name each running request once")
            seen.add(r)
            if r not in self.seq_lens:
                running = ", ".join(str(k) for k in sorted(self.seq_lens)) or "none"
                raise UnknownRequestError(f"request row {r} is not running; running rows: {running} "
                                          "(add() starts a request, release() ends it)")
        return rows

    def _allocate(self, index: torch.Tensor, seq: torch.Tensor, seq_cpu: torch.Tensor) -> torch.Tensor:
        if self.allocator.page_size == 1:
            loc = self.allocator.alloc(int(index.numel()))
        else:
            table = self.req_to_token_pool.req_to_token
            last = table[index, (seq - 2).clamp(min=0)].to(torch.int64)
            loc = self.allocator.alloc_decode(seq, seq_cpu, torch.where(seq > 1, last, torch.full_like(last, -1)))
        if loc is None:
            raise OutOfKVSlotsError(f"the KV allocator has no free slot for {int(index.numel())} more tokens")
        return loc.to(torch.int64)

    def live_token_indices(self) -> torch.Tensor:
        """Every KV slot a running request holds (for checks before a resize)."""
        table = self.req_to_token_pool.req_to_token
        parts = [table[r, :n].to(torch.int64) for r, n in self.seq_lens.items() if n]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=self.device)

    def release(self, rows: Sequence[int]) -> None:
        """Finish requests: free their KV slots and request rows."""
        rows = self._running(rows)  # all checked before any is freed
        table = self.req_to_token_pool.req_to_token
        for r in rows:
            n = self.seq_lens.pop(r)
            if n:
                self.allocator.free(table[r, :n].to(torch.int64))
        self.req_to_token_pool.free(list(rows))
