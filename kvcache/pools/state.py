"""RecurrentStatePool: per-request conv and SSM state for Mamba-2 / gated-delta-net layers.

Slot 0 is padding; a request holds `slots_per_request` slots (more than one when a
radix cache keeps states of shared prefixes).
"""

from __future__ import annotations

from typing import Sequence

import torch

from kvcache.sizing.layer_specs import RecurrentStateSpec
from kvcache.memory import device_buffers
from kvcache.memory.device_buffers import tensor_bytes
from kvcache.pools.codec import LayerIndex
from kvcache.pools.held_slots import release_held


class RecurrentStatePool:
    """`num_slots` slots (padding included) of every state layer's conv and SSM tensors."""

    def __init__(self, *, num_slots: int, spec: RecurrentStateSpec, layer_ids: Sequence[int], device: torch.device) -> None:
        self.num_slots = num_slots
        self.spec = spec
        self.device = device
        self._local = LayerIndex(layer_ids)
        self.layer_ids = self._local.layer_ids
        segments = [((num_slots, *spec.ssm_shape), spec.ssm_dtype), ((num_slots, *spec.conv_shape), spec.conv_dtype)]
        parts = device_buffers.carve(segments * len(self.layer_ids), device)  # one allocation, SSM first for alignment
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
        return tensor_bytes((*self.conv, *self.ssm))

    def named_tensors(self, prefix: str = "state") -> dict[str, torch.Tensor]:
        """Every tensor by the plan's name (`state.{layer}.ssm`, `.conv`), layer by layer."""
        out: dict[str, torch.Tensor] = {}
        for layer, ssm, conv in zip(self.layer_ids, self.ssm, self.conv):
            out[f"{prefix}.{layer}.ssm"], out[f"{prefix}.{layer}.conv"] = ssm, conv
        return out
