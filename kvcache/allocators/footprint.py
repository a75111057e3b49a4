"""The device bytes an allocator's own index buffers take: stated once, used by the planner.

A token allocator keeps one int64 free-list entry per token, a paged one per page;
an SWA allocator keeps both sides' free lists and an int64 full -> SWA map with a
row per full-pool row (tokens + one padding page).
"""

from __future__ import annotations

INDEX_BYTES = 8  # torch.int64


def free_list_bytes(tokens: int, page_size: int) -> int:
    return (tokens // page_size) * INDEX_BYTES


def allocator_index_bytes(full_tokens: int, page_size: int, swa_tokens: int | None = None) -> int:
    """Bytes of every index buffer the allocator for these pools allocates."""
    total = free_list_bytes(full_tokens, page_size)
    if swa_tokens is not None:
        total += free_list_bytes(swa_tokens, page_size) + (full_tokens + page_size) * INDEX_BYTES
    return total
