"""MemoryPoolConfig: the plan. Token and request counts, and the bytes of every buffer.

A frozen, JSON-encodable msgspec Struct. Every buffer the configurator allocates is
listed here, so the bytes it predicts are the bytes it allocates; every tensor too
(`tensors()`: name, shape, dtype, bytes, emitted by the layer specs that own them, the request
table and the allocator's footprint), and each buffer's bytes are the sum of its arena slots.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from kvcache.sizing.allocator_footprint import allocator_index_bytes, allocator_slots
from kvcache.sizing.tensor_plan import PlannedSlot, PlannedTensor, per_layer, tensor
from kvcache.sizing.arena_sizes import arena_size, slot_size
from kvcache.sizing.memory_budget import MemoryBudget

PoolKind = Literal["full", "swa", "mla"]
# What a pool holding fewer tokens than one full-context request means: "refuse" it (the project's strict answer,
# the one advice and `fit` search against), or "cap" each request at the pool less one token and plan it (SGLang
# 0.5.23 warns and runs; kvcache.engines.sglang sets it).
BelowOneRequest = Literal["refuse", "cap"]
DRAFT_POOL_PREFIX = "draft_"  # a draft worker's pools, which the target's plan pays for

REQ_TO_TOKEN_ELEMENT_BYTES = 4  # int32 token indices (tests check the table's bytes against it)


def request_table_slot(requests: int, row_width: int, with_state_slots: bool = False) -> PlannedSlot:
    """The request table: int32 token indices per row (row 0 is padding), and for a hybrid model each row's
    state slot (kvcache.pools.req_to_token takes these)."""
    rows = requests + 1
    table = tensor("req_to_token.table", (rows, row_width), "int32")
    state = (tensor("req_to_token.state_slot", (rows,), "int32"),) if with_state_slots else ()
    return PlannedSlot("req_to_token", (table, *state))


class KVPoolPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One per-token pool: `num_tokens` usable rows plus one padding page."""

    name: str
    kind: PoolKind
    num_layers: int
    bytes_per_token: int
    num_tokens: int
    page_size: int
    holds_every_token: bool = True
    layer_ids: tuple[int, ...] = ()  # the layers it holds, and one token's tensors in each (the layer spec's)
    row: tuple[PlannedTensor, ...] = ()
    # what the engine charges its budget for one token of this pool where that is more than the pool holds
    # (EngineRules.draft_charged_bytes_per_token); None: what it holds
    charged_bytes_per_token: int | None = None

    @property
    def charged_unheld_bytes(self) -> int:
        """Budget the engine charges for this pool's tokens beyond the rows it allocates: kept free, never used."""
        if self.charged_bytes_per_token is None:
            return 0
        return max(0, self.charged_bytes_per_token - self.bytes_per_token) * self.num_tokens

    @property
    def of_draft_worker(self) -> bool:
        return self.name.startswith(DRAFT_POOL_PREFIX)

    @property
    def num_rows(self) -> int:
        """Rows allocated: the tokens plus page 0, which absorbs padded writes."""
        return self.num_tokens + self.page_size

    @property
    def total_bytes(self) -> int:
        """Every layer's rows, in one slot of the worker's arena (kvcache.memory.device_buffers.slot_size)."""
        return slot_size(self.num_rows * self.bytes_per_token)

    @property
    def buffer(self) -> str:
        """Its name among the worker's buffers, and the prefix of its tensors' names."""
        return f"kv_{self.name}"

    def slot(self) -> PlannedSlot:
        """Every layer's tensors over num_rows rows, layer by layer, in one slot: `kv_{name}.{layer}.{tensor}`."""
        return PlannedSlot(self.buffer, per_layer(self.buffer, self.layer_ids, self.row, self.num_rows))


class StatePoolPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request recurrent state (Mamba-2 / gated delta net): slot 0 is padding."""

    num_layers: int
    bytes_per_slot: int
    num_slots: int
    slots_per_request: int
    layer_ids: tuple[int, ...] = ()  # the state layers, and one slot's tensors in each (the layer spec's)
    slot: tuple[PlannedTensor, ...] = ()

    @property
    def usable_slots(self) -> int:
        return self.num_slots - 1

    @property
    def request_cap(self) -> int:
        """Requests the state slots can serve at once."""
        return self.usable_slots // self.slots_per_request

    @property
    def total_bytes(self) -> int:
        return slot_size(self.num_slots * self.bytes_per_slot)

    def arena_slot(self) -> PlannedSlot:
        """Every state layer's SSM and conv tensors over num_slots slots, in one arena slot: `state.{layer}.ssm`."""
        return PlannedSlot("state", per_layer("state", self.layer_ids, self.slot, self.num_slots))


class MemoryPoolConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The sizing outcome for one engine (a target, plus any draft pools it pays for)."""

    budget: MemoryBudget
    page_size: int
    context_length: int
    max_total_num_tokens: int
    max_running_requests: int
    req_to_token_row_width: int
    kv_pools: tuple[KVPoolPlan, ...]
    state_pool: StatePoolPlan | None = None
    # the request table's rows (less padding) in a plan re-planned within pools already built (resized_plan_request):
    # the table is not resized, so such a plan charges the rows it holds; None: max_running_requests + 1 rows
    request_table_requests: int | None = None
    # the rule a re-plan of this plan (resized_plan_request) follows below one full-context request, set by the
    # planner: "cap" where it planned this pool below one request, each request capped (the engine runs it so), else
    # "refuse": a re-plan does not take a plan that holds a full request below one
    below_one_request: BelowOneRequest = "refuse"

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs in the pools that hold every token (full, MLA, draft)."""
        return sum(p.bytes_per_token for p in self.kv_pools if p.holds_every_token)

    @property
    def request_token_cap(self) -> int | None:
        """Tokens one request may hold where the pool holds fewer than context_length: the pool less one (SGLang
        0.5.23's max_req_len, min(context - 1, pool - 1), in tp_worker.py; prompts 5 fewer). None when it holds more."""
        if self.max_total_num_tokens >= self.context_length or self.every_layer_slides:
            return None
        return self.max_total_num_tokens - 1

    @property
    def every_layer_slides(self) -> bool:
        """No pool holds every token: each request keeps its last window, so a short pool caps no request."""
        return not any(p.kind != "swa" for p in self.kv_pools)

    @property
    def req_to_token_bytes(self) -> int:
        """(request table requests + 1) rows of int32 token indices (row 0 is padding); hybrid
        models add one int32 column mapping each row to its state slot. One allocation."""
        return self.req_to_token_slot().nbytes

    def req_to_token_slot(self) -> PlannedSlot:
        """The request table (kvcache.sizing.pool_config.request_table_slot): a row per request it holds."""
        return request_table_slot(self.table_requests, self.req_to_token_row_width, self.state_pool is not None)

    @property
    def table_requests(self) -> int:
        """Requests the request table holds: max_running_requests, or the rows of the table as built."""
        return self.request_table_requests or self.max_running_requests

    def worker_slots(self, *, draft: bool = False) -> tuple[PlannedSlot, ...]:
        """Every tensor one worker carves from its arena, slot by slot in arena order (worker_buffers' order):
        the target's request table, allocator buffers and state, then its pools; a draft worker's own pools."""
        out: list[PlannedSlot] = []
        if not draft:
            out.append(self.req_to_token_slot())
            out.extend(self.allocator_slots())
            if self.state_pool is not None:
                out.append(self.state_pool.arena_slot())
        out.extend(p.slot() for p in self.kv_pools if p.of_draft_worker == draft)
        return tuple(out)

    def allocator_slots(self, *, check_frees: bool = False) -> tuple[PlannedSlot, ...]:
        """The allocator's part of the plan: its free lists over max_total_num_tokens in pages (and, with a paired
        window pool, the window's list and the full -> SWA map); the allocator reads its sizes from these.
        `check_frees` adds the is_free flags of an allocator that checks every free: never in the worker's arena
        (worker_slots has none), so only an allocator that carves its own (a test's, or a resize's fresh one
        replacing one that checked) has them."""
        window = self.paired_window_pool
        return allocator_slots(self.max_total_num_tokens, self.page_size, window.num_tokens if window else None,
                               check_frees=check_frees)

    def tensors(self, *, draft: bool = False) -> tuple[PlannedTensor, ...]:
        """The plan's tensor list for one worker, in arena order."""
        return tuple(t for s in self.worker_slots(draft=draft) for t in s.tensors)

    def pool(self, name: str) -> KVPoolPlan:
        for p in self.kv_pools:
            if p.name == name:
                return p
        raise KeyError(f"no KV pool named {name!r}; pools: {[p.name for p in self.kv_pools]}")

    def window_pool(self, *, draft: bool = False) -> KVPoolPlan | None:
        """One worker's sliding-window pool paired with its full pool (sized by swa_full_tokens_ratio: it holds
        a window of tokens, not every token), if any: that worker's attention pool is then hybrid."""
        return next((p for p in self.kv_pools if not p.holds_every_token and p.of_draft_worker == draft), None)

    @property
    def paired_window_pool(self) -> KVPoolPlan | None:
        """The window pool the engine's one allocator maps full -> SWA indices for (the target's, else a
        draft's): the allocator is SWA-paired exactly when there is one. The one place hybrid-ness is decided."""
        return self.window_pool(draft=False) or self.window_pool(draft=True)

    @property
    def allocator_index_bytes(self) -> int:
        """The allocator's free lists (and the SWA index map when a window pool is paired)."""
        window = self.paired_window_pool
        return allocator_index_bytes(self.max_total_num_tokens, self.page_size, window.num_tokens if window else None)

    def worker_buffers(self, *, draft: bool = False) -> dict[str, int]:
        """The buffers one worker carves from its arena, by name: the target's request table,
        allocator lists, state and pools; a draft worker's own pools."""
        out: dict[str, int] = {}
        if not draft:
            out = {"req_to_token": self.req_to_token_bytes, "allocator_index": self.allocator_index_bytes}
            if self.state_pool is not None:
                out["state"] = self.state_pool.total_bytes
        for p in self.kv_pools:
            if p.of_draft_worker == draft:
                out[p.buffer] = p.total_bytes
        return out

    def arena_bytes(self, *, draft: bool = False) -> int:
        """The one allocation a worker makes for its buffers (kvcache.sizing.arena_sizes.arena_size)."""
        return arena_size(sum(self.worker_buffers(draft=draft).values()))

    @property
    def buffers(self) -> dict[str, int]:
        """Every buffer the configurator allocates, by name, in bytes (target's, then any draft's), with
        each arena's rounding up to 2 MiB as `arena_padding` (`draft_arena_padding`): they sum to total_bytes."""
        out: dict[str, int] = {}
        for draft, prefix in ((False, ""), (True, DRAFT_POOL_PREFIX)):
            worker = self.worker_buffers(draft=draft)
            out.update(worker)
            padding = self.arena_bytes(draft=draft) - sum(worker.values())
            if padding:
                out[f"{prefix}arena_padding"] = padding
        return out

    @property
    def total_bytes(self) -> int:
        """What the plan allocates: each worker's arena (its buffers plus the arena's rounding)."""
        return self.arena_bytes() + self.arena_bytes(draft=True)

    @property
    def charged_bytes(self) -> int:
        """What the plan takes from the budget: what it allocates, and what the engine charges for tokens beyond
        the rows its pools hold (KVPoolPlan.charged_unheld_bytes), which stays free."""
        return self.total_bytes + sum(p.charged_unheld_bytes for p in self.kv_pools)

    def to_dict(self) -> dict:
        """A JSON-ready dict, derived numbers included."""
        data = msgspec.to_builtins(self)
        data.update(bytes_per_token=self.bytes_per_token, request_token_cap=self.request_token_cap, buffers=self.buffers, total_bytes=self.total_bytes,
                    arena_bytes={"target": self.arena_bytes(), "draft": self.arena_bytes(draft=True)},
                    tensors={w: msgspec.to_builtins(self.tensors(draft=w == "draft")) for w in ("target", "draft")})
        for d, p in zip(data["kv_pools"], self.kv_pools):
            d.update(num_rows=p.num_rows, total_bytes=p.total_bytes)
        if self.state_pool is not None:
            data["state_pool"].update(
                usable_slots=self.state_pool.usable_slots, request_cap=self.state_pool.request_cap,
                total_bytes=self.state_pool.total_bytes,
            )
        return data
