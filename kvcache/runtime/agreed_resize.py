"""The post-capture resize across ranks: every rank keeps the smallest resized token count.

Each rank decides its own shrink from what it measured after capture (kvcache.runtime);
ranks that share one scheduler must still hold one token count, so the decisions are
MIN-reduced as int64 and a rank that would keep more re-plans within its own budget.
"""

from __future__ import annotations

import msgspec

from kvcache.sizing.planning import plan_pool_sizes
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.runtime.resize import PostCaptureKVResize
from kvcache.sizing.resized_plan import resized_plan_request


def capped_resize(resize: PostCaptureKVResize, max_tokens: int) -> PostCaptureKVResize:
    """The resize with at most `max_tokens` tokens after it, re-planned within the same budget."""
    if resize.tokens_after <= max_tokens:
        return resize
    request = resized_plan_request(resize.before, resize.after.budget.budget_bytes)
    after = plan_pool_sizes(msgspec.structs.replace(request, max_total_tokens=max_tokens))
    return msgspec.structs.replace(resize, after=after)


def agree_on_resize(resize: PostCaptureKVResize, ranks: RankAgreement) -> PostCaptureKVResize:
    """Every rank's resize capped at the ranks' smallest token count (a collective: all ranks call it)."""
    (agreed,) = ranks.min_int64((resize.tokens_after,))
    return ranks.run_everywhere(lambda: capped_resize(resize, agreed))
