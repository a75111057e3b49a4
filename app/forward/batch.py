"""DecodeBatch (what one decode step reads) and DecodeRequests (a minimal scheduler that fills it).

The scheduler does what SGLang's does for a decode step: one new KV slot per running
request from the allocator (token-level, or the next slot of the request's last page),
written into the request's row of req_to_token at its new position.
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
                                   f"{width} (the context length); release it or raise --context-length")
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        seq = torch.tensor(new_lens, dtype=torch.int64, device=self.device)
        loc = self._allocate(index, seq, torch.tensor(new_lens, dtype=torch.int64))
        table = self.req_to_token_pool.req_to_token
        table[index, seq - 1] = loc.to(torch.int32)
        for r, n in zip(rows, new_lens):
            self.seq_lens[r] = n
        return DecodeBatch(input_ids=input_ids.to(self.device, torch.int64), positions=seq - 1, req_pool_indices=index,
                           seq_lens=seq.to(torch.int32), out_cache_loc=loc)

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
