"""From the plan's tensor list to the views pools and allocators hold: the one road from layout to bytes.

The builder carves a worker's planned slots (MemoryPoolConfig.worker_slots) from its arena in one pass
(`carve_slots`) and hands each pool and allocator the views of its names. A pool takes its part of the plan (a
KVPoolPlan, the StatePoolPlan, the request-table slot) as the one statement of what it holds, and the views it is
given (`take_views`) are checked against that part's planned slot; it computes no shape or dtype of its own. A
per-token pool reports its part of the plan (`PlannedRows`) and, resized live, takes the resized plan's part. One
built outside a worker (a test, a benchmark, the fresh allocator of a resize) is given nothing and carves its
planned slots from an arena of its own (`standalone_views`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kvcache.errors import PlanMismatchError
from kvcache.memory.device_buffers import Arena
from kvcache.sizing.layer_specs import TokenSpec
from kvcache.sizing.pool_config import KVPoolPlan, MemoryPoolConfig
from kvcache.memory.torch_dtypes import dtype_name, torch_dtype
from kvcache.sizing.tensor_plan import PlannedSlot, PlannedTensor

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


class PlannedRows:
    """What a per-token pool (MHA, MLA) reports of the part of the plan it holds, its planned slot over the views it
    was given: `size`, `nbytes` and `named_tensors` describe the rows it holds now, as built or as a live resize
    (kvcache.runtime.live_resize) left them. Its buffers keep the addresses and the rows they were built with
    (captured CUDA graphs hold them); after a shrink the rows past size + page_size are unmapped."""

    size: int
    page_size: int
    _slot: PlannedSlot
    _views: list[torch.Tensor]

    @property
    def buffer(self) -> str:
        """Its name among the worker's buffers (KVPoolPlan.buffer), the prefix of its tensors' names."""
        return self._slot.buffer

    @property
    def nbytes(self) -> int:
        """Its slot of the arena for the rows it holds now, every layer back to back, 512-byte aligned: the bytes
        the plan it holds (the built one, or a resize's) charges for it."""
        return slots_nbytes([self._slot])

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by the plan's name, layer by layer, over the rows it holds now: the views it was given, or
        after a resize to fewer rows their first rows (the same addresses)."""
        return {t.name: v if v.shape[0] == t.shape[0] else v[:t.shape[0]]
                for t, v in zip(self._slot.tensors, self._views)}

    def rows_now(self) -> int:
        """Rows it holds now: its tokens and the padding page."""
        return self.size + self.page_size

    def bytes_held(self, nbytes_as_built: int) -> int:
        """`nbytes_as_built` (bytes of some of its tensors over the rows they were built with) scaled to the rows it
        holds now: every tensor has a row per token, so the share is exact."""
        built = self._views[0].shape[0] if self._views else 1
        return nbytes_as_built // built * self.rows_now()

    def check_resize(self, plan: MemoryPoolConfig) -> KVPoolPlan:
        """Its part of `plan`, the same tensors over at most the rows it was built with (its buffers' addresses),
        or PlanMismatchError naming what differs; nothing changes."""
        part = next((p for p in plan.kv_pools if p.buffer == self.buffer), None)
        built = self._views[0].shape[0] if self._views else 0
        if part is None:
            raise PlanMismatchError(f"the plan to resize to has no pool {self.buffer!r}; it has "
                                    f"{[p.buffer for p in plan.kv_pools]}")
        layout = [(t.name, t.shape[1:], t.dtype) for t in part.slot().tensors]
        if layout != [(t.name, t.shape[1:], t.dtype) for t in self._slot.tensors] or part.page_size != self.page_size:
            raise PlanMismatchError(f"the plan to resize {self.buffer!r} to lists other tensors or pages than it holds")
        if part.num_rows > built:
            raise PlanMismatchError(f"{self.buffer!r} was built with {built} rows; a resize to {part.num_tokens} "
                                    f"tokens needs {part.num_rows}")
        return part

    def resize(self, plan: MemoryPoolConfig) -> None:
        """Hold `plan`'s part from now on (check_resize; the live resize maps its rows first): size, nbytes and
        named_tensors describe its rows."""
        part = self.check_resize(plan)
        self._slot, self.size = part.slot(), part.num_tokens
