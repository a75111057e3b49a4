"""What an allocator is given, checked once: its planned slots (the free lists' logs, the SWA sides), the indices
and page sizes its callers pass, the segments they free. Each check raises with what was expected and what came.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from kvcache.errors import PlanMismatchError
from kvcache.sizing.allocator_footprint import FREE_LOGS, LOG_LENGTH_FACTOR, SWA_SIDES, free_log_slots
from kvcache.sizing.tensor_plan import PlannedSlot


def reject_meta(device: torch.device, op: str) -> None:
    """Raise ValueError for index operations on a meta allocator (see the module docstring)."""
    if device.type == "meta":
        raise ValueError(
            f"{op}() on a meta-device allocator: meta tensors hold no values, so it has no real "
            "indices to hand out or take back; build the allocator on cpu or cuda"
        )


INDEX_DTYPES = (torch.int64, torch.int32)  # index dtypes taken as they are (kernels and torch ops read both)


def as_indices(indices: torch.Tensor, device: torch.device, what: str) -> torch.Tensor:
    """indices as a flat integer tensor on device (themselves when they already are: the hot path)."""
    if indices.dim() == 1 and indices.device == device and indices.dtype in INDEX_DTYPES:
        return indices
    if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
        raise ValueError(f"{what} must be an integer tensor, got dtype {indices.dtype}")
    return indices.reshape(-1).to(device=device, dtype=torch.int64)


def checked_page_size(page_size: int) -> int:
    """`page_size`, or ValueError unless it is at least 1 (a page holds at least one token)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return page_size


def check_need_size(need_size: int, page_size: int) -> None:
    """Raise ValueError unless need_size is a non-negative multiple of page_size."""
    if need_size < 0:
        raise ValueError(f"need_size must be >= 0, got {need_size}")
    if need_size % page_size:
        raise ValueError(f"need_size {need_size} is not a multiple of page_size {page_size}")


def page_disjoint(segments: Iterable[tuple[torch.Tensor, int]], page_size: int) -> Iterator[tuple[torch.Tensor, int]]:
    """The non-empty (kv indices, start position) segments, checking that no two share a page (SGLang's rule)."""
    prev_end: int | None = None
    for free_index, start_pos in segments:
        n = free_index.numel()
        if n == 0:
            continue
        if prev_end is not None and start_pos // page_size <= (prev_end - 1) // page_size:
            raise ValueError(f"segment at position {start_pos} shares a page with the one ending at {prev_end}")
        prev_end = start_pos + n
        yield free_index, start_pos


def planned_free_list(slots: Sequence[PlannedSlot], unit: str) -> tuple[int, bool]:
    """(ids, whether frees are checked) of a free list's planned slots: they must be free_log_slots(ids, check)
    (two int64 logs of LOG_LENGTH_FACTOR entries per id, and to check frees one bool per id and the padding id),
    each tensor in its own slot, or PlanMismatchError lists what was given."""
    slots = tuple(slots)
    first = slots[0].tensors[0] if slots and slots[0].tensors else None
    ids = first.shape[0] // LOG_LENGTH_FACTOR if first is not None and len(first.shape) == 1 else 0
    check = len(slots) > FREE_LOGS
    if ids < 1 or _layout(slots) != _layout(free_log_slots(ids, check)):
        given = "; ".join(", ".join(f"{t.name} {t.shape} {t.dtype}" for t in s.tensors) for s in slots) or "nothing"
        raise PlanMismatchError(
            f"a free list of {unit}s is planned as {FREE_LOGS} int64 logs of {LOG_LENGTH_FACTOR} entries per id, one "
            f"id at least (and, to check frees, one bool per id and the padding id), each in a slot; given {given}")
    return ids, check


def _layout(slots: Sequence[PlannedSlot]) -> list[list[tuple[tuple[int, ...], str]]]:
    return [[(t.shape, t.dtype) for t in s.tensors] for s in slots]


def planned_swa_sides(slots: Sequence[PlannedSlot]) -> tuple[tuple[PlannedSlot, ...], tuple[PlannedSlot, ...], PlannedSlot]:
    """The full side's free-list slots, the SWA side's and the map's, by their planned names (allocator_slots)."""
    sides = tuple(tuple(s for s in slots if any(f".{side}" in t.name for t in s.tensors)) for side in SWA_SIDES)
    rest = [s for s in slots if not any(s in side for side in sides)]
    if len(rest) != 1 or not all(sides):
        raise PlanMismatchError(
            f"an SWA allocator is planned as two free lists ({' and '.join(f'*.{side}*' for side in SWA_SIDES)}) and the "
            f"full -> SWA map; given {', '.join(t.name for s in slots for t in s.tensors) or 'nothing'}")
    return sides[0], sides[1], rest[0]
