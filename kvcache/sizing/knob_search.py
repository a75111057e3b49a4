"""One knob at a time: the value of each that plans (a --mem-fraction-static, a context length, a request cap, a
state or window share, a budget), found by a binary search that re-runs the pure planner, so every value named
is one that was planned. The suggestions (kvcache.sizing.advice) are made of these.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable

import msgspec

from kvcache.arithmetic import align_up
from kvcache.errors import DoesNotFitError
from kvcache.sizing.planning import plan_pool_sizes, state_slots
from kvcache.sizing.plan_request import MAX_DEFAULT_RUNNING_REQUESTS, PlanRequest


def fits(req: PlanRequest, *, full_context: bool = True) -> bool:
    """Whether `req` plans with one full-context request in its pools (what every suggestion is checked for);
    with full_context=False, whether it plans as its engine runs it (requests capped, where the engine allows)."""
    try:
        plan_pool_sizes(msgspec.structs.replace(req, below_one_request="refuse") if full_context else req)
    except DoesNotFitError:
        return False
    return True


def with_budget(req: PlanRequest, budget_bytes: int) -> PlanRequest:
    """The request with another KV budget."""
    return msgspec.structs.replace(req, budget=msgspec.structs.replace(req.budget, budget_bytes=budget_bytes))


def smallest_passing(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest n in [lo, hi] with ok(n), for ok monotone (false then true); None if ok(hi) fails."""
    if lo > hi or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def largest_passing(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), for ok monotone (true then false); None if ok(lo) fails: the
    same search counted down from `hi`."""
    down = smallest_passing(0, hi - lo, lambda k: ok(hi - k))
    return None if down is None else hi - down


def smallest_fitting_mem_fraction(req: PlanRequest, budget_for: Callable[[float], int]) -> float | None:
    """The smallest mem_fraction_static (to 0.001) whose budget plans, or None if even 0.99 does not."""
    def ok(milli: int) -> bool:
        budget = budget_for(milli / 1000)
        return budget > 0 and fits(with_budget(req, budget))

    milli = smallest_passing(1, 990, ok)
    return None if milli is None else milli / 1000


def with_context(req: PlanRequest, context: int) -> PlanRequest:
    """The request with another context_length; the request table keeps its extra (draft-token) columns."""
    extra = req.req_to_token_row_width - req.context_length
    return msgspec.structs.replace(req, context_length=context, req_to_token_row_width=context + extra)


def longest_fitting_context(req: PlanRequest) -> int | None:
    """The longest context_length (a page multiple, at least the engine's start-up minimum) that plans with
    everything else unchanged."""
    page = req.page_size
    top = max(1, (req.context_length - 1) // page)
    lowest = align_up(req.minimums.context_length, page) // page
    pages = largest_passing(lowest, top, lambda n: fits(with_context(req, n * page)))
    return None if pages is None else pages * page


def most_running_requests_that_run(req: PlanRequest) -> int | None:
    """Where the engine runs requests capped below the context and `req` does not plan: the most
    --max-running-requests (fewer than today's cap) that plans, its request table leaving the pool more; else None.
    A long context makes each row of the table long: SGLang 0.5.23's default 2,048 rows of 10M tokens take 80 GiB."""
    if req.below_one_request != "cap" or fits(req, full_context=False):
        return None
    top = (req.max_running_requests or MAX_DEFAULT_RUNNING_REQUESTS) - 1
    return largest_passing(1, top, lambda n: fits(msgspec.structs.replace(req, max_running_requests=n),
                                                  full_context=False))


def smallest_fitting_swa_ratio(req: PlanRequest) -> float | None:
    """The smallest swa_full_tokens_ratio (to 0.001) above the current one that plans, or None."""
    if not any(p.share == "swa" for p in req.kv_pools):
        return None
    milli = smallest_passing(
        int(req.swa_ratio * 1000) + 1, 1000,
        lambda m: fits(msgspec.structs.replace(req, swa_ratio=Fraction(m, 1000))),
    )
    return None if milli is None else milli / 1000


def _with_state(req: PlanRequest, **fields: object) -> PlanRequest:
    assert req.state is not None
    return msgspec.structs.replace(req, state=msgspec.structs.replace(req.state, **fields))


def largest_fitting_state_slots(req: PlanRequest) -> int | None:
    """The most usable state slots (<= the asked --max-mamba-cache-size) that plan, or None; when fewer
    than one request's are asked, that request's count if it plans."""
    if req.state is None or req.state.max_slots is None:
        return None
    top, least = req.state.max_slots, req.state.slots_per_request  # fewer slots than one request never plans
    if top < least:
        return least if fits(_with_state(req, max_slots=least)) else None
    return largest_passing(least, top, lambda n: fits(_with_state(req, max_slots=n)))


def smallest_fitting_mamba_ratio(req: PlanRequest) -> float | None:
    """Without --max-mamba-cache-size: the smallest mamba_full_memory_ratio (to 0.001) above the current one
    whose state share holds one request's slots, if the plan fits with it; else None."""
    s = req.state
    if s is None or s.max_slots is not None:
        return None

    def holds_one_request(milli: int) -> bool:  # usable slots: the planner's count less the padding slot
        return state_slots(_with_state(req, memory_ratio=Fraction(milli, 1000))) - 1 >= s.slots_per_request

    current = int(s.memory_ratio * 1000)
    milli = smallest_passing(current + 1, max(current + 1, 1000 * 1000), holds_one_request)
    if milli is None or not fits(_with_state(req, memory_ratio=Fraction(milli, 1000))):
        return None
    return milli / 1000


def smallest_fitting_budget(req: PlanRequest, limit: int) -> int | None:
    """The fewest budget bytes (<= limit) that plan, or None."""
    return smallest_passing(1, limit, lambda b: fits(with_budget(req, b)))
