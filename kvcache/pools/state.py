"""RecurrentStatePool: per-request conv and SSM state for Mamba-2 / gated-delta-net layers.

Slot 0 is padding; a request holds `slots_per_request` slots (more than one when a
radix cache keeps states of shared prefixes). Its tensors are the views of the plan's state slot
(RecurrentStateSpec.slot_tensors per layer), handed to it by the builder (kvcache.pools.planned_views);
built alone it carves them from an arena of its own.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kvcache.sizing.layer_specs import RecurrentStateSpec
from kvcache.pools.codec import LayerIndex
from kvcache.pools.held_slots import release_held
from kvcache.pools.planned_views import Views, slots_nbytes, take_views
from kvcache.sizing.tensor_plan import PlannedSlot, per_layer

STATE_BUFFER = "state"  # the plan's name of the state pool's slot, and the prefix of its tensors


class RecurrentStatePool:
    """`num_slots` slots (padding included) of every state layer's conv and SSM tensors: the views named
    `state.{layer}.ssm` and `.conv` in `views`, or, without views, an arena of its own."""

    def __init__(self, *, num_slots: int, spec: RecurrentStateSpec, layer_ids: Sequence[int], device: torch.device,
                 views: Views | None = None) -> None:
        self.num_slots = num_slots
        self.spec = spec
        self.device = device
        self._local = LayerIndex(layer_ids)
        self.layer_ids = self._local.layer_ids
        self._slot = PlannedSlot(STATE_BUFFER, per_layer(STATE_BUFFER, self.layer_ids, spec.slot_tensors(), num_slots))
        self._views = parts = take_views([self._slot], views, device)  # every layer's SSM then conv (the wider dtype first)
        self.ssm: list[torch.Tensor] = parts[0::2]
        self.conv: list[torch.Tensor] = parts[1::2]
        self._free: list[int] = list(range(num_slots - 1, 0, -1))
        self._held = bytearray(num_slots)

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
