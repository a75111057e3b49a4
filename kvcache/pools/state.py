"""RecurrentStatePool: per-request conv and SSM state for Mamba-2 / gated-delta-net layers.

Slot 0 is padding; a request holds `slots_per_request` slots (more than one when a
radix cache keeps states of shared prefixes). What it holds is the plan's state pool
(kvcache.sizing.pool_config.StatePoolPlan.arena_slot(): each layer's SSM and conv tensors over its slots), stated
there once; the views are handed to it by the builder (kvcache.pools.planned_views) and checked against that slot;
built alone it carves them from an arena of its own.
"""

from __future__ import annotations

import torch

from kvcache.pools.codec import LayerIndex
from kvcache.pools.held_slots import release_held
from kvcache.pools.planned_views import Views, slots_nbytes, take_views
from kvcache.sizing.pool_config import StatePoolPlan


class RecurrentStatePool:
    """`num_slots` slots (padding included) of every state layer's conv and SSM tensors: the views named
    `state.{layer}.ssm` and `.conv` in `views`, or, without views, an arena of its own."""

    def __init__(self, *, plan: StatePoolPlan, device: torch.device, views: Views | None = None) -> None:
        self.num_slots = plan.num_slots
        self.device = device
        self._local = LayerIndex(plan.layer_ids)
        self.layer_ids = self._local.layer_ids
        self._slot = plan.arena_slot()
        self._views = take_views([self._slot], views, device)
        planned = list(zip(self._slot.tensors, self._views))  # layer by layer, each view by its planned tensor's name
        self.ssm: list[torch.Tensor] = [v for t, v in planned if t.name.endswith(".ssm")]
        self.conv: list[torch.Tensor] = [v for t, v in planned if t.name.endswith(".conv")]
        self._free: list[int] = list(range(self.num_slots - 1, 0, -1))
        self._held = bytearray(self.num_slots)

    def get_state(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv, ssm) buffers of one layer, indexed by slot."""
        i = self._local(layer_id)
        return self.conv[i], self.ssm[i]

    def alloc(self, need: int = 1) -> list[int] | None:
        """`need` free slots, or None (taking nothing) when fewer are free."""
        if need < 0:
            raise ValueError(f"cannot allocate a negative number of state slots ({need})")
        if need > len(self._free):
            return None
        taken = [self._free.pop() for _ in range(need)]
        for slot in taken:
            self._held[slot] = 1
        return taken

    def free(self, slots: list[int]) -> None:
        """Give back slots; refuses padding slot 0, slots out of range and slots already free (nothing changes):
        a slot freed twice would be handed to two requests, which would then share one recurrent state."""
        release_held(self._held, slots, "state slot")
        self._free.extend(slots)

    def available_size(self) -> int:
        return len(self._free)

    @property
    def nbytes(self) -> int:
        """Its slot of the arena (the plan's bytes)."""
        return slots_nbytes([self._slot])

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by the plan's name (`state.{layer}.ssm`, `.conv`), layer by layer."""
        return dict(zip((t.name for t in self._slot.tensors), self._views))
