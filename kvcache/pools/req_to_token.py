"""ReqToTokenPool: one int32 row per running request, mapping positions to KV token indices.

Row 0 is padding (never handed out: CUDA-graph padded batches point at it). Hybrid
models also map each row to its recurrent-state slot (`req_to_state_slot`). The API
is SGLang 0.5.23's: alloc(reqs) binds a row to each request that has none (a chunked
request keeps its row), free(req) unbinds it, write(indices, values) stores indices.
Ours also refuses a double free and a row out of range, on the host at no device cost. What it holds is the
plan's request-table slot (kvcache.sizing.pool_config.request_table_slot), stated there once: its rows, width and
state column are read from it. The views are handed to it by the builder (kvcache.pools.planned_views) and checked
against that slot; built alone it carves them from an arena of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvcache.pools.held_slots import release_held
from kvcache.pools.planned_views import Views, slots_nbytes, take_views
from kvcache.sizing.tensor_plan import PlannedSlot


def kv_record(req: Any) -> Any:
    """Where a request keeps its row: SGLang 0.5.23's `req.kv` record, or the request itself (older SGLang)."""
    return getattr(req, "kv", req)


def holds_row(req: Any) -> bool:
    return kv_record(req).req_pool_idx is not None


class ReqToTokenPool:
    """The request table `slot` plans (MemoryPoolConfig.req_to_token_slot): `size` request rows plus the padding
    row of `max_context_len` token indices, the views named `req_to_token.table` (and `.state_slot`) in `views`,
    or, without views, an arena of its own. `size` is the rows it was built with: a live resize keeps the table
    (kvcache.runtime.live_resize resizes the KV pools only), and the measured sizing's resized plans may run fewer
    requests (their max_running_requests) than it has rows."""

    pre_alloc_size = 0  # SGLang 0.5.23: extra rows only its disaggregated-decode pool has
    enable_mamba_extra_buffer_lazy = False

    def __init__(self, *, slot: PlannedSlot, device: torch.device, views: Views | None = None) -> None:
        rows, self.max_context_len = slot.tensors[0].shape
        self.size = rows - 1
        self.device = device
        self._slot = slot
        self._views = parts = take_views([slot], views, device)
        self.req_to_token = parts[0]
        self.req_to_state_slot = parts[1] if len(parts) > 1 else None
        self.req_generation = torch.zeros(rows, dtype=torch.int64)  # host; +1 per reuse, never reset
        self._on_alloc_rows: Callable[[list[int]], None] | None = None
        self.clear()

    def alloc(self, reqs: Sequence[Any] | int) -> list[int] | None:
        """SGLang 0.5.23: a row for every request without one (set on req.kv.req_pool_idx); the rows of all
        of them in order, or None (binding nothing) when too few are free. An int n takes n unbound rows."""
        if isinstance(reqs, int):
            return self.alloc_rows(reqs)
        unbound = [r for r in reqs if not holds_row(r)]
        rows = self.alloc_rows(len(unbound))
        if rows is None:
            return None
        for req, row in zip(unbound, rows):
            kv_record(req).req_pool_idx = row
        return [kv_record(r).req_pool_idx for r in reqs]

    def alloc_rows(self, need_size: int) -> list[int] | None:
        """need_size rows bound to no request, or None when fewer are free. O(need_size)."""
        if need_size < 0:
            raise ValueError(f"cannot allocate a negative number of request rows ({need_size})")
        if need_size > len(self._free_slots):
            return None
        if need_size == 0:
            return []
        rows = self._free_slots[-need_size:]
        del self._free_slots[-need_size:]
        for row in rows:
            self._held[row] = 1
        self.req_generation[rows] += 1
        if self._on_alloc_rows is not None:
            try:
                self._on_alloc_rows(rows)
            except BaseException:
                self.free_rows(rows)  # a failed hook leaves no row taken
                raise
        return rows

    def free(self, req: Any) -> None:
        """SGLang 0.5.23: give back the request's row and unbind it. A row number or a list of them also works."""
        if isinstance(req, (int, list)):
            self.free_rows([req] if isinstance(req, int) else req)
            return
        record = kv_record(req)
        if record.req_pool_idx is None:
            raise ValueError("free(req) of a request that holds no row (freed twice, or never allocated)")
        self.free_rows([record.req_pool_idx])
        record.req_pool_idx = None

    def free_rows(self, rows: Sequence[int]) -> None:
        """Give back rows; refuses padding row 0, rows out of range and rows already free (nothing changes)."""
        release_held(self._held, rows, "request row")
        self._free_slots.extend(rows)

    def available_size(self) -> int:
        return len(self._free_slots)

    @property
    def free_slots(self) -> tuple[int, ...]:
        """The rows free to hand out (never padding row 0), under SGLang 0.5.23's name: its scheduler's idle check
        counts them against size + pre_alloc_size. A copy, so a reader cannot take or return a row behind the pool."""
        return tuple(self._free_slots)

    def clear(self) -> None:
        self._free_slots: list[int] = list(range(1, self.size + 1))
        self._held = bytearray(self.size + 1)

    def write(self, indices: Any, values: torch.Tensor | int, *legacy: torch.Tensor) -> None:
        """SGLang 0.5.23: req_to_token[indices] = values (indices e.g. (row, slice) or (rows, positions)).

        The older three-argument form write(row, positions, token_indices) still works.
        """
        if legacy:
            indices, values = (indices, values), legacy[0]
        if isinstance(values, torch.Tensor) and values.dtype != torch.int32:
            values = values.to(torch.int32)
        self.req_to_token[indices] = values

    # SGLang 0.5.23's scheduler calls these on any request table; an auxiliary per-request cache (MiniCPM
    # sparse attention, DeepSeek-V4's compressed KV) is not modelled, so none is ever attached.

    def register_on_alloc_rows(self, hook: Callable[[list[int]], None]) -> None:
        """Call hook(rows) whenever rows are handed out (one hook, as SGLang allows)."""
        if self._on_alloc_rows is not None:
            raise ValueError("an on_alloc_rows hook is already registered")
        self._on_alloc_rows = hook

    def attach_aux_cache(self, aux_cache: Any) -> None:
        raise ValueError(f"auxiliary per-request caches ({type(aux_cache).__name__}) are not modelled by this pool")

    def schedulable_token_capacity(self, physical_capacity: int) -> int:
        """Tokens the scheduler may plan for: the KV pool's own (no auxiliary cache caps it)."""
        return physical_capacity

    def alloc_aux_to_lengths(self, *, req_pool_indices_cpu: torch.Tensor, target_seq_lens_cpu: torch.Tensor) -> None:
        """Grow auxiliary caches to the new lengths: there are none."""

    def reset_aux_cache_allocator(self) -> None:
        """After a post-capture resize: no auxiliary cache to reset."""

    @property
    def nbytes(self) -> int:
        """Its slot of the arena (the plan's bytes)."""
        return slots_nbytes([self._slot])

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The table and (hybrid models) the state-slot column, by the plan's names."""
        return dict(zip((t.name for t in self._slot.tensors), self._views))
