"""Applying a resize to live objects: a fresh allocator holding the old one's tokens in use, and each pool's kept bytes.

Only the allocator's public API is used (alloc, free, available_size): the free tokens are
taken out of the old allocator, checked against the new size, and the in-use set is rebuilt
in the fresh one, smaller or larger. Tokens in use past the new size refuse the resize;
nothing changes then. The taken tokens go back to the old allocator if the resize fails
later (`undo`). kvcache.runtime.live_resize applies both to the pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.errors import KVCacheError


class LiveTokensInTailError(KVCacheError):
    """Tokens still in use lie past the new pool size; the resize would drop them."""


@dataclass(frozen=True, slots=True)
class AllocatorSwap:
    """The allocator to use from now on, and the free tokens taken from the old one until the resize commits or is
    undone."""

    allocator: Any
    old: Any
    taken: tuple[torch.Tensor, ...]  # the old allocator's free tokens, by chunk (paged: a token of each page)

    def undo(self) -> None:
        """The resize failed after the swap: give the old allocator its free tokens back (drop the new one)."""
        give_back(self.old, self.taken)


CARRY_CHUNK_TOKENS = 1 << 16  # the swap works through the token lists this many at a time (1.5 MiB of temporaries)


def carry_transient_bytes(*, tokens: int, grown_tokens: int) -> int:
    """Device bytes carry_tokens_in_use holds beyond both allocators (lists of up to `tokens` ids): one chunk's
    ids, masks and copies, and the ids of the `grown_tokens` new tokens copied out before any is freed (int64
    each; with pages, one id a page: fewer)."""
    return 3 * 8 * min(CARRY_CHUNK_TOKENS, tokens) + 8 * max(grown_tokens, 0)


def take_free_tokens(allocator: Any, step: int) -> list[torch.Tensor]:
    """Every free token of `allocator` taken, `step` tokens (whole pages) at a time: each chunk as alloc() gave it
    (page 1: a view of its own list) or, paged, one token of each page (alloc() expands pages into tokens; a
    paged free() frees every page a token lies in)."""
    page, parts, left = allocator.page_size, [], allocator.available_size()
    try:
        while left:
            part = allocator.alloc(min(step, left))
            assert part is not None
            parts.append(part if page == 1 else part[::page].clone())
            left -= part.numel()
    except BaseException:
        give_back(allocator, parts)
        raise
    return parts


def give_back(allocator: Any, parts: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> None:
    """Free what take_free_tokens took, chunk by chunk."""
    for part in parts:
        allocator.free(part)


def carry_tokens_in_use(old: Any, new: Any, *, chunk_tokens: int = CARRY_CHUNK_TOKENS) -> AllocatorSwap:
    """`new` (fresh: every token free, of any size in whole pages) made to hold exactly the tokens `old` has in use.

    The old allocator is left with nothing free (a stale holder of it cannot hand out a released
    slot) until `undo()`; tokens in use past `new.size` refuse the swap and change nothing. The token lists
    are worked through `chunk_tokens` (whole pages) at a time: the swap runs when the built pools fill the
    card, so its temporaries must not grow with the pool (carry_transient_bytes)."""
    page = old.page_size
    if new.page_size != page or new.size % page:
        raise ValueError(f"the new allocator's {new.size} tokens in pages of {new.page_size} do not continue the old "
                         f"one's pages of {page}")
    if new.available_size() != new.size:
        raise ValueError(f"the new allocator has {new.size - new.available_size()} tokens in use; it must be fresh")
    step = max(chunk_tokens // page, 1) * page  # a paged free frees every page it touches: never split one
    last_new, last_old = new.size // page, old.size // page  # page p holds tokens p*page .. p*page+page-1
    free = take_free_tokens(old, step)
    try:
        kept_ids = sum(int((part // page <= last_new).sum()) for part in free)
        dropped = (sum(part.numel() for part in free) - kept_ids) * page  # paged: each id stands for its page
        live_past = max(old.size - new.size, 0) - dropped
        if live_past:
            raise LiveTokensInTailError(
                f"{live_past} KV tokens in use lie past token {new.size}; shrinking the pool from {old.size} would "
                "drop them. Resize right after CUDA-graph capture, before requests run"
            )
        grown = [part[part // page > last_old] for part in take_free_tokens(new, step)]  # copies of new's own ids
        for part in free:  # old free ones, then any grown
            new.free(part[part // page <= last_new])
        give_back(new, grown)
    except BaseException:
        give_back(old, free)  # the old allocator as it was
        raise
    return AllocatorSwap(allocator=new, old=old, taken=tuple(free))


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
