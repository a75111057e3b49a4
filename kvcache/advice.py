"""What would fit: re-run the pure planner with one knob changed and name the values that work.

Each suggestion names a flag and a value that was checked by planning with it.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable

import msgspec

from kvcache.errors import DoesNotFitError
from kvcache.planning import PlanRequest, plan_pool_sizes


def fits(req: PlanRequest) -> bool:
    try:
        plan_pool_sizes(req)
    except DoesNotFitError:
        return False
    return True


def _with_budget(req: PlanRequest, budget_bytes: int) -> PlanRequest:
    return msgspec.structs.replace(req, budget=msgspec.structs.replace(req.budget, budget_bytes=budget_bytes))


def smallest_fitting_mem_fraction(req: PlanRequest, budget_for: Callable[[float], int]) -> float | None:
    """The smallest mem_fraction_static (to 0.001) whose budget plans, or None if even 0.99 does not."""
    def ok(milli: int) -> bool:
        budget = budget_for(milli / 1000)
        return budget > 0 and fits(_with_budget(req, budget))

    lo, hi = 1, 990
    if not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo / 1000


def longest_fitting_context(req: PlanRequest) -> int | None:
    """The longest context_length (a page multiple) that plans with everything else unchanged."""
    page = req.page_size
    extra = req.req_to_token_row_width - req.context_length

    def ok(ctx: int) -> bool:
        return fits(msgspec.structs.replace(req, context_length=ctx, req_to_token_row_width=ctx + extra))

    lo, hi = 1, max(1, (req.context_length - 1) // page)
    if not ok(lo * page):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid * page):
            lo = mid
        else:
            hi = mid - 1
    return lo * page


def smallest_fitting_swa_ratio(req: PlanRequest) -> float | None:
    """The smallest swa_full_tokens_ratio (to 0.001) above the current one that plans, or None."""
    if not any(p.share == "swa" for p in req.kv_pools):
        return None

    def ok(milli: int) -> bool:
        return fits(msgspec.structs.replace(req, swa_ratio=Fraction(milli, 1000)))

    lo = int(req.swa_ratio * 1000) + 1
    hi = 1000
    if lo > hi or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo / 1000


def smallest_fitting_budget(req: PlanRequest, limit: int) -> int | None:
    """The fewest budget bytes (<= limit) that plan, or None."""
    if not fits(_with_budget(req, limit)):
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(_with_budget(req, mid)):
            hi = mid
        else:
            lo = mid + 1
    return lo


def suggest_fixes(
    req: PlanRequest,
    *,
    budget_for_fraction: Callable[[float], int] | None,
    kv_cache_memory_limit: int | None,
    fp8_request: PlanRequest | None,
) -> tuple[str, ...]:
    """Checked alternatives, most direct first."""
    out: list[str] = []
    ratio = smallest_fitting_swa_ratio(req)
    if ratio is not None:
        out.append(f"--swa-full-tokens-ratio {ratio:.3f}")
    if budget_for_fraction is not None:
        fraction = smallest_fitting_mem_fraction(req, budget_for_fraction)
        if fraction is not None:
            out.append(f"--mem-fraction-static {fraction:.3f}")
    if kv_cache_memory_limit is not None:
        need = smallest_fitting_budget(req, kv_cache_memory_limit)
        if need is not None:
            out.append(f"--kv-cache-memory {need} (the least that holds one full-length request)")
    if fp8_request is not None and fits(fp8_request):
        tokens = plan_pool_sizes(fp8_request).max_total_num_tokens
        out.append(f"--kv-cache-dtype fp8_e4m3 ({tokens} tokens fit)")
    context = longest_fitting_context(req)
    if context is not None:
        out.append(f"--context-length {context} (the longest that fits)")
    if not out:
        out.append("a larger --tp-size (or --pp-size) to spread weights and KV over more devices, or a bigger card")
    return tuple(out)
