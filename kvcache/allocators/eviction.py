"""What an allocator asks a prefix cache to evict, in SGLang 0.5.23's terms.

SGLang's scheduler calls `allocator.evict_to_free_tokens(tree_cache, n)` before it
allocates; the allocator works out each side's shortfall and hands the cache one
`evict_for_alloc(params)` call. `EvictParams` has SGLang's field names, so SGLang's
own RadixCache (which reads `params.num_tokens`, `params.swa_num_tokens`) accepts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class EvictParams:
    """Tokens to evict from the full side, the sliding-window side, and recurrent-state slots."""

    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


def shares_prefixes(tree_cache: Any) -> bool:
    """Whether the cache keeps prefixes that eviction could free (SGLang: supports_prefix_sharing())."""
    if tree_cache is None:
        return False
    supports = getattr(tree_cache, "supports_prefix_sharing", None)
    return bool(supports()) if supports is not None else True


def evict_shortfall(tree_cache: Any, *, full_shortfall: int, swa_shortfall: int = 0) -> None:
    """One evict_for_alloc call for what is missing; nothing when nothing is, or the cache shares nothing."""
    if (full_shortfall > 0 or swa_shortfall > 0) and shares_prefixes(tree_cache):
        tree_cache.evict_for_alloc(EvictParams(num_tokens=max(full_shortfall, 0), swa_num_tokens=max(swa_shortfall, 0)))
