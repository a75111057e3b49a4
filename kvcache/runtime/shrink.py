"""Applying a resize to live objects: a smaller allocator with the same tokens in use, and each pool's kept bytes.

Only the allocator's public API is used (alloc, free, available_size): the free tokens
are taken out, checked against the tail, and the in-use set is rebuilt in a smaller
allocator. Tokens in use past the new size refuse the resize; nothing changes then.
The taken tokens go back to the old allocator if the resize fails later (`undo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.errors import KVCacheError


class LiveTokensInTailError(KVCacheError):
    """Tokens still in use lie past the new pool size; the resize would drop them."""


@dataclass(frozen=True, slots=True)
class AllocatorShrink:
    """A smaller allocator, and the free tokens taken from the old one until the resize commits or is undone."""

    allocator: Any
    old: Any
    taken: torch.Tensor | None  # None when the size did not change

    def undo(self) -> None:
        """The resize failed after the shrink: give the old allocator its free tokens back (drop the smaller one)."""
        if self.taken is not None:
            self.old.free(self.taken)


def shrink_allocator(allocator: Any, new_size: int) -> AllocatorShrink:
    """A new token or paged allocator of `new_size` tokens in which exactly the old in-use tokens are in use.

    The old allocator is left with nothing free (a stale holder of it cannot hand out a released
    slot) until `undo()`; live tokens past `new_size` refuse the shrink and change nothing."""
    old_size, page = allocator.size, allocator.page_size
    if new_size == old_size:
        return AllocatorShrink(allocator=allocator, old=allocator, taken=None)
    if not 0 < new_size < old_size or new_size % page:
        raise ValueError(f"a shrink goes from {old_size} to a smaller positive multiple of {page}, not {new_size}")
    free = allocator.alloc(allocator.available_size())
    assert free is not None
    kept = free // page <= new_size // page  # page p holds tokens p*page .. p*page+page-1; pages 1..size/page
    live_in_tail = (old_size - new_size) - int((~kept).sum())
    if live_in_tail:
        allocator.free(free)
        raise LiveTokensInTailError(
            f"{live_in_tail} KV tokens in use lie past token {new_size}; shrinking the pool from {old_size} would "
            "drop them. Resize right after CUDA-graph capture, before requests run"
        )
    from kvcache.allocators import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    device, pool = allocator.device, allocator.get_kvcache()  # the same pool, addressed by fewer tokens
    smaller: Any = (TokenToKVPoolAllocator(size=new_size, device=device, kvcache=pool) if page == 1 else
                    PagedTokenToKVPoolAllocator(size=new_size, page_size=page, device=device, kvcache=pool))
    taken = smaller.alloc(new_size)
    assert taken is not None
    smaller.free(free[kept])
    return AllocatorShrink(allocator=smaller, old=allocator, taken=free)


def pool_buffers(pool: Any) -> list[torch.Tensor]:
    """Every per-layer storage tensor of an MHA or MLA pool (data, FP4 scales, DSA indexer keys), rows first."""
    from kvcache.pools import MLATokenToKVPool

    latent = isinstance(pool, MLATokenToKVPool)  # one latent per layer; MHA keeps K and V apart
    out: list[torch.Tensor] = []
    for layer in pool.layer_ids:
        out.append(pool.get_key_buffer(layer))
        if not latent:
            out.append(pool.get_value_buffer(layer))
        for scales in (pool.get_key_scales(layer), None if latent else pool.get_value_scales(layer)):
            if scales is not None:
                out.append(scales)
        if latent and pool.index_row_bytes:  # DSA's indexer keys are per token too
            out.append(pool.get_index_k_with_scale_buffer(layer))
    return out


def released_address_ranges(buffers: list[torch.Tensor], rows: int) -> list[tuple[int, int]]:
    """[start, end) device addresses of each buffer's rows from `rows` on: what a shrink gives back. A buffer with
    no rows past `rows` gives back nothing and has no range (its empty tail may start at its allocation's very end)."""
    ranges = []
    for t in buffers:
        if not t.is_contiguous():
            raise ValueError("a pool buffer to shrink must be contiguous (one row after another)")
        if t.shape[0] <= rows:
            continue
        row_bytes = t.stride(0) * t.element_size()
        ranges.append((t.data_ptr() + rows * row_bytes, t.data_ptr() + t.shape[0] * row_bytes))
    return ranges


def complement(ranges: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) outside every range: what an allocation keeps when `ranges` are released."""
    kept, cursor = [], start
    for s, e in sorted(ranges):
        if s > cursor:
            kept.append((cursor, min(s, end)))
        cursor = max(cursor, e)
    if cursor < end:
        kept.append((cursor, end))
    return [(s, e) for s, e in kept if e > s]
