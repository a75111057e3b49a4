"""How many bytes a buffer takes where the engine puts it: plain integer rounding, no device (so plans use it).

An arena is one allocation of `arena_size(slots)` bytes (a 2 MiB multiple of at least 10 MiB, which the CUDA
caching allocator serves from a segment of exactly that size), each buffer in it a `slot_size` (512-byte
aligned) stretch; one allocation on its own takes `allocation_size(nbytes)` (kvcache.memory.device_buffers).
"""

from __future__ import annotations

from kvcache.arithmetic import align_up
from kvcache.byte_units import MiB

BLOCK_ROUND = 512
LARGE_ROUND = 2 * MiB
SMALL_UP_TO = 1 * MiB
HOST_MAP_THRESHOLD = 1 * MiB
OWN_SEGMENT_FROM = 10 * MiB  # the caching allocator's kMinLargeAlloc: requests this big get their own segment
SLOT_ALIGN = 512


def allocation_size(nbytes: int) -> int:
    """Bytes a buffer of `nbytes` really occupies (the formula every plan uses)."""
    if nbytes <= 0:
        return 0
    rounded = align_up(nbytes, BLOCK_ROUND)
    return align_up(rounded, LARGE_ROUND) if rounded > SMALL_UP_TO else rounded


def arena_size(slot_bytes: int) -> int:
    """Bytes of one arena holding `slot_bytes` of slots: a 2 MiB multiple, at least 10 MiB (0 for none)."""
    if slot_bytes <= 0:
        return 0
    return max(align_up(slot_bytes, LARGE_ROUND), OWN_SEGMENT_FROM)


def slot_size(nbytes: int) -> int:
    """Bytes a buffer takes inside an arena: packed back to back, each 512-byte aligned."""
    return align_up(nbytes, SLOT_ALIGN)
