"""The device bytes an allocator's own index buffers take: stated once, used by the planner.

Stated in sizing so the planner need not import the allocators above it. A token allocator keeps two free logs (kvcache.allocators.free_log ping-pongs between
them on compaction) of two int64 entries per token each, a paged one per page (plus,
with check_frees, one bool per id and one for the padding id); an SWA allocator keeps
both sides' free logs and an int64 full -> SWA map with a row per full-pool row (tokens +
one padding page) and SGLang's trailing -1 row, each buffer in a slot of the worker's KV
arena (kvcache.memory.device_buffers.slot_size: 512-byte aligned). An allocator built in an
arena has `nbytes` equal to this (on its own, each buffer takes the caching allocator's
allocation_size instead, the same up to 1 MiB). Nothing is allocated after construction
except, rarely, transient copies: a backup's free ids when a restore spans two
compactions (free_log), and backup journals of the SWA map, sized by what changes
between backup and restore.
"""

from __future__ import annotations

from kvcache.memory.device_buffers import slot_size

LOG_LENGTH_FACTOR = 2  # free-log entries per id: room for `capacity` frees between compactions
FREE_LOGS = 2  # the active log and the one a compaction copies into
INDEX_BYTES = 8  # torch.int64
FLAG_BYTES = 1  # torch.bool


def free_list_bytes(tokens: int, page_size: int, check_frees: bool = False) -> int:
    """The two free logs (two entries per page each; per token at page_size 1: 2 x 16 B = 32 B/token),
    plus the is-free flags when checking."""
    ids = tokens // page_size
    logs = FREE_LOGS * slot_size(LOG_LENGTH_FACTOR * ids * INDEX_BYTES)
    return logs + (slot_size((ids + 1) * FLAG_BYTES) if check_frees else 0)


def allocator_index_bytes(
    full_tokens: int, page_size: int, swa_tokens: int | None = None, *, check_frees: bool = False,
) -> int:
    """Bytes of every index buffer the allocator for these pools allocates."""
    total = free_list_bytes(full_tokens, page_size, check_frees)
    if swa_tokens is not None:
        total += free_list_bytes(swa_tokens, page_size, check_frees) + slot_size((full_tokens + page_size + 1) * INDEX_BYTES)
    return total
