"""The capacity questions SGLang 0.5.23's scheduler asks any allocator, every step, with no type branches.

Its prefill admission (`create_prefill_budget`), decode check (`check_decode_capacity`),
generation clip (`max_new_tokens_for_memory`), decode-node preallocation (`prealloc_*`) and
idle diagnostics call these on whatever allocator it was given. Ours answer from their own
free counts. The prefill budget is the scheduler's policy object, not ours: it is SGLang's
own class, built over this allocator (so it is imported from SGLang, only when SGLang's
scheduler asks for it). Features we do not model (host-offloaded KV, Mamba byte sharing)
answer "nothing to add": no reserve, no donor, no byte model.
"""

from __future__ import annotations

from typing import Any

from kvcache.allocators.eviction import evict_shortfall
from kvcache.arithmetic import ceil_div


class SchedulerCapacityHooks:
    """Mixed into every allocator: needs page_size, available_size() and evict_to_free_tokens()."""

    page_size: int
    available_size: Any  # () -> int, from the allocator
    evict_to_free_tokens: Any  # (tree_cache, num_tokens) -> None, from the allocator

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> Any:
        """SGLang's PrefillBudget over this allocator (the admission policy is the scheduler's)."""
        from sglang.srt.mem_cache.prefill_budget import PrefillBudget  # only SGLang's scheduler calls this

        return PrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        """KV slots a request needs beyond its tokens: none (no per-request workspace in these pools)."""
        return 0

    def max_new_tokens_for_memory(
        self, input_tokens: int, max_new_tokens: int, *, token_capacity: int, sliding_window_size: int | None,
        chunk_size: int | None,
    ) -> int | None:
        """max_new_tokens clipped to what an empty pool of token_capacity leaves after the page-rounded prompt,
        one page of decode slack and the padding token (SGLang 0.5.23's rule); 0 when the prompt alone fills it."""
        prompt = ceil_div(input_tokens, self.page_size) * self.page_size
        return max(0, min(max_new_tokens, token_capacity - prompt - self.page_size - 1))

    def prealloc_fits_assumes_reclaim(self) -> bool:
        """prealloc_fits answers about the pool as it stands (not after evicting)."""
        return False

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        """None: no ceiling beyond the scheduler's own token capacity."""
        return None

    def prealloc_fits(
        self, tree_cache: Any, full_tokens: int, swa_tokens: int, *, full_budget_tokens: int,
        swa_budget_tokens: int | None = None,
    ) -> bool:
        """Whether a decode-node preallocation fits the scheduler's per-side budgets (separate buffers per side)."""
        return full_tokens <= full_budget_tokens and (swa_budget_tokens is None or swa_tokens <= swa_budget_tokens)

    def check_decode_capacity(self, *, num_tokens: int, tree_cache: Any, requests: Any = None,
                              spec_algorithm: Any = None) -> bool:
        """Whether the next decode step's num_tokens fit once the cache evicted what it can for them."""
        self.evict_to_free_tokens(tree_cache, num_tokens)
        return self.available_size() >= num_tokens

    def verify_byte_accounting(self) -> list[str]:
        """Idle-time diagnostic: no byte model to recheck (token-counted pools), so no violations."""
        return []

    def mamba_full_cache_donor(self) -> None:
        """No shared Mamba/KV buffer to reclaim from."""
        return None

    def merge_and_sort_free(self) -> None:
        """Nothing staged: frees go straight to the free log."""

    def debug_print(self) -> str:
        return f"#available-size: {self.available_size()}, "


class SWACapacityHooks:
    """Where a full + sliding-window allocator answers differently from one pool (SGLang 0.5.23's SWA allocator).
    Needs full_available_size() and swa_available_size()."""

    full_available_size: Any
    swa_available_size: Any

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> Any:
        """SGLang's SWAPrefillBudget over this allocator (the admission policy is the scheduler's)."""
        from sglang.srt.mem_cache.prefill_budget import SWAPrefillBudget  # only SGLang's scheduler calls this

        return SWAPrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def reclaim_for_prealloc(self, tree_cache: Any, full_tokens: int, swa_tokens: int) -> str | None:
        """Room for a decode-node preallocation: the SWA side evicts for itself (the scheduler prices the full
        side from its budget); None when ready, else the shortfall in words."""
        available = self.swa_available_size()
        if available < swa_tokens:
            evict_shortfall(tree_cache, full_shortfall=0, swa_shortfall=swa_tokens - available)
            available = self.swa_available_size()
        if available < swa_tokens:
            return f"the sliding-window side has {available} free tokens after eviction, {swa_tokens} needed"
        return None

    def swa_capacity_and_available(self, *, full_capacity: int, swa_capacity: int) -> tuple[tuple[int, int], ...]:
        """(capacity, free) of each side, capacities as the scheduler counts them."""
        return (full_capacity, self.full_available_size()), (swa_capacity, self.swa_available_size())

    def debug_print(self) -> str:
        return f"#swa-available-size: {self.swa_available_size()}, #full-available-size: {self.full_available_size()}, "
