"""The planner's input (PlanRequest): the budget, the page and context, each pool's and the state's demand, the caps,
and what the engine starts with; kvcache.sizing.planning sizes a plan from it."""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

import msgspec

from kvcache.inputs.sglang_ratios import SGLANG_SWA_FULL_TOKENS_RATIO
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.sizing.pool_config import BelowOneRequest, KVPoolPlan, PoolKind, StatePoolPlan
from kvcache.sizing.tensor_plan import PlannedTensor

DEFAULT_REQUESTS_PER_CONTEXT = 512
MIN_DEFAULT_RUNNING_REQUESTS = 2048
MAX_DEFAULT_RUNNING_REQUESTS = 4096


class KVPoolDemand(msgspec.Struct, frozen=True, kw_only=True):
    """A per-token pool to size: its layers' bytes per token and whether it holds every token or a window."""

    name: str
    kind: PoolKind
    num_layers: int
    bytes_per_token: int
    window: int | None = None  # the sliding window of a sliding-window pool
    share: Literal["all", "swa"] = "all"  # "swa": align_down(T * swa_ratio) tokens, paired with a full pool
    layer_ids: tuple[int, ...] = ()  # the layers it holds, and one token's tensors in each (from the layer spec);
    row: tuple[PlannedTensor, ...] = ()  # empty only for a demand written by hand with its bytes alone
    charged_bytes_per_token: int | None = None  # the engine's charge a token where more than it holds (KVPoolPlan's)

    def sized(self, num_tokens: int, page_size: int) -> KVPoolPlan:
        """This pool holding `num_tokens` tokens in pages of `page_size`: its part of a plan."""
        return KVPoolPlan(
            name=self.name, kind=self.kind, num_layers=self.num_layers, bytes_per_token=self.bytes_per_token,
            num_tokens=num_tokens, page_size=page_size, holds_every_token=self.share == "all",
            layer_ids=self.layer_ids, row=self.row, charged_bytes_per_token=self.charged_bytes_per_token,
        )


class StateDemand(msgspec.Struct, frozen=True, kw_only=True):
    """Recurrent state to size: bytes of one slot (all this rank's state layers) and how slots are shared."""

    num_layers: int
    bytes_per_slot: int
    slots_per_request: int
    memory_ratio: Fraction  # state : KV share of the budget (mamba_full_memory_ratio)
    max_slots: int | None = None  # usable slots asked for (max_mamba_cache_size)
    layer_ids: tuple[int, ...] = ()  # the state layers, and one slot's tensors in each (from the layer spec)
    slot: tuple[PlannedTensor, ...] = ()

    def sized(self, num_slots: int) -> StatePoolPlan:
        """This state in `num_slots` slots (padding slot included): its part of a plan."""
        return StatePoolPlan(
            num_layers=self.num_layers, bytes_per_slot=self.bytes_per_slot, num_slots=num_slots,
            slots_per_request=self.slots_per_request, layer_ids=self.layer_ids, slot=self.slot,
        )


class StartupMinimums(msgspec.Struct, frozen=True, kw_only=True):
    """The least an engine's own start-up checks accept; below it the engine refuses to start, so nothing is
    planned or suggested there. Each engine states its own once, citing its source (kvcache.engines)."""

    context_length: int = 1  # tokens one request may reach
    pool_tokens: int = 1  # KV tokens the pool holds


class PlanRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the planner needs, as plain numbers."""

    budget: MemoryBudget
    page_size: int
    context_length: int
    req_to_token_row_width: int
    kv_pools: tuple[KVPoolDemand, ...]
    swa_ratio: Fraction = SGLANG_SWA_FULL_TOKENS_RATIO
    state: StateDemand | None = None
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    attention_dp_size: int = 1
    below_one_request: BelowOneRequest = "refuse"  # (kvcache.sizing.pool_config); the plan keeps it
    request_table_requests: int | None = None  # a table already built with this many rows (MemoryPoolConfig's)
    minimums: StartupMinimums = StartupMinimums()  # the engine's (EngineRules.minimums)
