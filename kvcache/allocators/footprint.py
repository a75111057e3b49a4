"""The device bytes an allocator's own index buffers take: stated once, used by the planner.

A token allocator keeps one int64 free-list entry per token, a paged one per page
(plus, with check_frees, one bool per id and one for the padding id); an SWA
allocator keeps both sides' free lists and an int64 full -> SWA map with a row per
full-pool row (tokens + one padding page), each buffer at allocation_size (the bytes
the device allocator really takes). Each allocator's `nbytes` equals this.
Backup journals are transient and sized by what changes between backup and restore.
"""

from __future__ import annotations

from kvcache.device_buffers import allocation_size

INDEX_BYTES = 8  # torch.int64
FLAG_BYTES = 1  # torch.bool


def free_list_bytes(tokens: int, page_size: int, check_frees: bool = False) -> int:
    """One free-list entry per page (per token at page_size 1), plus the is-free flags when checking."""
    ids = tokens // page_size
    return allocation_size(ids * INDEX_BYTES) + (allocation_size((ids + 1) * FLAG_BYTES) if check_frees else 0)


def allocator_index_bytes(
    full_tokens: int, page_size: int, swa_tokens: int | None = None, *, check_frees: bool = False,
) -> int:
    """Bytes of every index buffer the allocator for these pools allocates."""
    total = free_list_bytes(full_tokens, page_size, check_frees)
    if swa_tokens is not None:
        total += free_list_bytes(swa_tokens, page_size, check_frees) + allocation_size((full_tokens + page_size) * INDEX_BYTES)
    return total
