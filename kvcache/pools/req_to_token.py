"""ReqToTokenPool: one int32 row per running request, mapping positions to KV token indices.

Row 0 is padding (never handed out). Hybrid models also map each row to its
recurrent-state slot (`req_to_state_slot`).
"""

from __future__ import annotations

import torch

from kvcache import device_buffers
from kvcache.device_buffers import tensor_bytes


class ReqToTokenPool:
    """`size` request rows (plus the padding row) of `max_context_len` token indices."""

    def __init__(self, *, size: int, max_context_len: int, device: torch.device, with_state_slots: bool = False) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        segments = [((size + 1, max_context_len), torch.int32)] + ([((size + 1,), torch.int32)] if with_state_slots else [])
        parts = device_buffers.carve(segments, device)
        self.req_to_token = parts[0]
        self.req_to_state_slot = parts[1] if with_state_slots else None
        self._free_slots: list[int] = list(range(size, 0, -1))

    def alloc(self, need_size: int = 1) -> list[int] | None:
        """Request rows, or None when fewer than `need_size` are free."""
        if need_size > len(self._free_slots):
            return None
        taken = self._free_slots[-need_size:] if need_size else []
        del self._free_slots[len(self._free_slots) - need_size:]
        return taken[::-1]

    def free(self, rows: int | list[int]) -> None:
        for row in [rows] if isinstance(rows, int) else rows:
            if not 1 <= row <= self.size:
                raise ValueError(f"request row {row} is not in 1..{self.size}")
            self._free_slots.append(row)

    def available_size(self) -> int:
        return len(self._free_slots)

    def clear(self) -> None:
        self._free_slots = list(range(self.size, 0, -1))

    def write(self, row: int, positions: slice, token_indices: torch.Tensor) -> None:
        """Record which KV tokens hold positions `positions` of request `row`."""
        self.req_to_token[row, positions] = token_indices.to(torch.int32)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(t for t in (self.req_to_token, self.req_to_state_slot) if t is not None)
