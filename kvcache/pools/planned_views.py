"""From the plan's tensor list to the views pools and allocators hold: the one road from layout to bytes.

The builder carves a worker's planned slots (MemoryPoolConfig.worker_slots) from its arena in one pass
(`carve_slots`) and hands each pool and allocator the views of its names. A pool takes its part of the plan (a
KVPoolPlan, the StatePoolPlan, the request-table slot) as the one statement of what it holds, and the views it is
given (`take_views`) are checked against that part's planned slot; it computes no shape or dtype of its own. One built outside a worker (a test, a benchmark, the fresh allocator
of a resize) is given nothing and carves its planned slots from an arena of its own (`standalone_views`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kvcache.errors import PlanMismatchError
from kvcache.memory.device_buffers import Arena
from kvcache.sizing.layer_specs import TokenSpec
from kvcache.sizing.pool_config import KVPoolPlan
from kvcache.sizing.tensor_plan import PlannedSlot, PlannedTensor, dtype_name, torch_dtype

Views = Mapping[str, torch.Tensor]


def kv_pool_slot(plan: KVPoolPlan, spec: TokenSpec) -> PlannedSlot:
    """A per-token pool's planned slot (KVPoolPlan.slot()), refused (PlanMismatchError naming both) unless `spec`,
    which the pool reads its encoding and widths from, is the spec the plan's row came from."""
    row = spec.row_tensors()
    if row != plan.row:
        raise PlanMismatchError(
            f"the spec given for {plan.buffer!r} stores a token as {_listed(row)}; the plan has {_listed(plan.row)}")
    return plan.slot()


def carve_slots(arena: Arena, slots: Sequence[PlannedSlot]) -> dict[str, torch.Tensor]:
    """Every tensor of `slots` by its planned name, carved from `arena` slot after slot in one pass."""
    out: dict[str, torch.Tensor] = {}
    for slot in slots:
        views = arena.carve_slot([(t.shape, torch_dtype(t.dtype)) for t in slot.tensors])
        out.update(zip((t.name for t in slot.tensors), views))
    return out


def standalone_views(slots: Sequence[PlannedSlot], device: torch.device) -> dict[str, torch.Tensor]:
    """`slots` carved from an arena of their own, exactly their slots' bytes (zeroed; on meta, no memory)."""
    return carve_slots(Arena(sum(s.nbytes for s in slots), torch.device(device)), slots)


def take_views(slots: Sequence[PlannedSlot], views: Views | None, device: torch.device | str) -> list[torch.Tensor]:
    """The views of the tensors these slots plan, in planned order: from `views` (the builder's carve), or,
    given None, from an arena of their own. A view missing, of another shape or dtype, or on another device is
    refused (PlanMismatchError naming it and what the plan has)."""
    device = torch.device(device)
    if views is None:
        views = standalone_views(slots, device)
    return [_checked(t, views.get(t.name), device) for s in slots for t in s.tensors]


def _checked(planned: PlannedTensor, view: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    want = f"{planned.shape} {planned.dtype} on {device}"
    if view is None:
        raise PlanMismatchError(f"no view was given for {planned.name!r}; the plan has {want}")
    got = (tuple(view.shape), dtype_name(view.dtype), view.device)
    on_device = got[2].type == device.type and device.index in (None, got[2].index)
    if got[:2] != (planned.shape, planned.dtype) or not on_device:
        raise PlanMismatchError(
            f"the view given for {planned.name!r} is {got[0]} {got[1]} on {got[2]}; the plan has {want}")
    return view


def _listed(row: tuple[PlannedTensor, ...]) -> str:
    return ", ".join(f"{t.name} {t.shape} {t.dtype}" for t in row) or "nothing"


def slots_nbytes(slots: Sequence[PlannedSlot]) -> int:
    """What these slots take of an arena (the plan's bytes for them): what a pool or allocator reports as nbytes."""
    return sum(s.nbytes for s in slots)
