"""The tensors an allocator's own index buffers are, and their bytes: stated once, for the planner and the allocators.

Stated in sizing so the planner need not import the allocators above it. The allocators are given these slots
(MemoryPoolConfig.allocator_slots: their part of the plan) and read their sizes from them, so this is the one
statement of their tensors; they take the views of exactly these tensors (kvcache.pools.planned_views). A token allocator keeps two free logs (kvcache.allocators.free_log ping-pongs between
them on compaction) of two int64 entries per token each, a paged one per page (plus,
with check_frees, one bool per id and one for the padding id); an SWA allocator keeps
both sides' free logs and an int64 full -> SWA map with a row per full-pool row (tokens +
one padding page) and SGLang's trailing -1 row, each buffer in a slot of the worker's KV
arena (kvcache.memory.device_buffers.slot_size: 512-byte aligned). An allocator's `nbytes` is
this, whether the builder handed it views of the worker's arena or it carved the same slots from
an arena of its own. Nothing is allocated after construction
except, rarely, transient copies: a backup's free ids when a restore spans two
compactions (free_log), and backup journals of the SWA map, sized by what changes
between backup and restore.
"""

from __future__ import annotations

import functools

from kvcache.sizing.tensor_plan import PlannedSlot, tensor

LOG_LENGTH_FACTOR = 2  # free-log entries per id: room for `capacity` frees between compactions
FREE_LOGS = 2  # the active log and the one a compaction copies into
ALLOCATOR_BUFFER = "allocator_index"  # the name of the allocator's slots in the plan's buffers
SWA_SIDES = ("full.", "swa.")  # an SWA pair's free lists are named {prefix}full.* and {prefix}swa.*


def free_log_slots(ids: int, check_frees: bool = False, *, prefix: str = "allocator.") -> tuple[PlannedSlot, ...]:
    """One free list of `ids` ids: two logs, each its own slot of int64 ids (two entries per id each), plus one
    bool per id and one for the padding id when checking frees (kvcache.allocators.free_log takes these)."""
    logs = tuple(PlannedSlot(ALLOCATOR_BUFFER, (tensor(f"{prefix}free_log.{i}", (LOG_LENGTH_FACTOR * ids,), "int64"),))
                 for i in range(FREE_LOGS))
    flags = (PlannedSlot(ALLOCATOR_BUFFER, (tensor(f"{prefix}is_free", (ids + 1,), "bool"),)),) if check_frees else ()
    return logs + flags


def free_list_slots(tokens: int, page_size: int, check_frees: bool = False, *,
                    prefix: str = "allocator.") -> tuple[PlannedSlot, ...]:
    """The free list of `tokens` tokens in pages of page_size: one id per page (per token at page_size 1:
    2 logs x 16 B = 32 B/token)."""
    return free_log_slots(tokens // page_size, check_frees, prefix=prefix)


def full_to_swa_slot(full_rows: int, *, prefix: str = "allocator.") -> PlannedSlot:
    """The int64 full -> SWA map: a row per full-pool row (tokens plus the padding page) and the trailing -1 row."""
    return PlannedSlot(ALLOCATOR_BUFFER, (tensor(f"{prefix}full_to_swa", (full_rows + 1,), "int64"),))


@functools.lru_cache(maxsize=4096)  # the planner's search asks for the same sizes several times per candidate
def allocator_slots(
    full_tokens: int, page_size: int, swa_tokens: int | None = None, *, check_frees: bool = False,
) -> tuple[PlannedSlot, ...]:
    """Every index buffer the allocator for these pools allocates, each a slot of the arena: its free lists, and
    for an SWA pair both sides' lists and the int64 full -> SWA map (full rows plus the trailing -1 row)."""
    if swa_tokens is None:
        return free_list_slots(full_tokens, page_size, check_frees)
    full, swa = (f"allocator.{side}" for side in SWA_SIDES)
    return (free_list_slots(full_tokens, page_size, check_frees, prefix=full)
            + free_list_slots(swa_tokens, page_size, check_frees, prefix=swa)
            + (full_to_swa_slot(full_tokens + page_size),))


@functools.lru_cache(maxsize=4096)
def allocator_index_bytes(
    full_tokens: int, page_size: int, swa_tokens: int | None = None, *, check_frees: bool = False,
) -> int:
    """Bytes of every index buffer the allocator for these pools allocates: the sum of its slots."""
    return sum(s.nbytes for s in allocator_slots(full_tokens, page_size, swa_tokens, check_frees=check_frees))
