"""plan_pool_sizes: pure integer sizing, numbers in and a MemoryPoolConfig out. No device.

The cost of holding T tokens (T a multiple of page_size) is the charge of the plan the
planner would return for T, `candidate_plan(req, T).charged_bytes`: each worker's arena
(kvcache.sizing.arena_sizes.arena_size: the slots' sum rounded up to 2 MiB, at least 10 MiB)
holding its buffers, every buffer in a slot of S(n) = slot_size(n) (n rounded up to 512 B):

    pools       S((tokens_p(T) + page_size) * bytes_per_token_p)
    allocator   allocator_index_bytes(T, page, swa tokens)         # free lists (+ SWA map)
    table       S((R(T) + 1) * (row_width [+ 1]) * 4)               # req_to_token (+ state-slot column)
    state       [S(slots * slot_bytes)]                             # hybrids: recurrent state
    unheld      T * (charged_p - bytes_per_token_p)                 # where the engine charges a pool more than it
                                                                    # holds (SGLang's STANDALONE draft): kept free

tokens_p(T) is T for pools that hold every token and align_down(T * swa_ratio) for
sliding-window pools, and R(T) is the running-request cap. The cost is monotone in T,
so the plan is the largest T whose cost fits the budget, found by bisection: nothing
is allocated beyond the budget, and one more page would not fit. There is no second
cost formula: what the bisection charges is what MemoryPoolConfig says is allocated, plus what it says the engine
charges and leaves unused.
"""

from __future__ import annotations

import msgspec

from kvcache.byte_units import format_bytes
from kvcache.errors import BudgetBelowOnePageError, BudgetBelowOneRequestError, DoesNotFitError
from kvcache.sizing.plan_request import (
    DEFAULT_REQUESTS_PER_CONTEXT, MAX_DEFAULT_RUNNING_REQUESTS, MIN_DEFAULT_RUNNING_REQUESTS, KVPoolDemand, PlanRequest,
)
from kvcache.sizing.pool_config import BelowOneRequest, MemoryPoolConfig
from kvcache.arithmetic import align_down, align_up


def _pool_tokens(req: PlanRequest, pool: KVPoolDemand, tokens: int) -> int:
    if pool.share == "all":
        return tokens
    return align_down(tokens * req.swa_ratio.numerator // req.swa_ratio.denominator, req.page_size)


def state_slots(req: PlanRequest) -> int:
    """Slots (padding slot included) from the state share budget * r / (1 + r), or the user's count."""
    s = req.state
    if s is None:
        return 0
    if s.max_slots is not None:
        return s.max_slots + 1
    share = req.budget.budget_bytes * s.memory_ratio.numerator // (s.memory_ratio.numerator + s.memory_ratio.denominator)
    return share // s.bytes_per_slot


def running_requests(req: PlanRequest, tokens: int, state_slots: int) -> int:
    """SGLang 0.5.23's one rule for running requests against the pool (`resolve_max_num_reqs` in
    srt/mem_cache/kv_cache_configurator.py), per attention-DP worker: the user's value divided over the
    DP workers, or clamp(T * 512 // context, 2048, 4096); either way at most T // 2 (two tokens a request
    in the pool this worker holds), and no more than the state slots can serve."""
    if req.max_running_requests is not None:
        cap = max(1, req.max_running_requests // req.attention_dp_size)
    else:
        cap = tokens * DEFAULT_REQUESTS_PER_CONTEXT // req.context_length
        cap = min(max(cap, MIN_DEFAULT_RUNNING_REQUESTS), MAX_DEFAULT_RUNNING_REQUESTS)
    cap = min(cap, tokens // 2)
    if req.state is not None:
        cap = min(cap, (state_slots - 1) // req.state.slots_per_request)
    return max(cap, 1)


def candidate_plan(req: PlanRequest, tokens: int, state_slots: int,
                   below_one_request: BelowOneRequest = "refuse") -> MemoryPoolConfig:
    """The plan for `tokens` tokens in the pools that hold every token (fitting or not); `below_one_request` is what
    plan_pool_sizes records (MemoryPoolConfig's), which changes no byte."""
    page = req.page_size
    pools = tuple(p.sized(_pool_tokens(req, p, tokens), page) for p in req.kv_pools)
    state_plan = req.state.sized(state_slots) if req.state is not None else None
    return MemoryPoolConfig(
        budget=req.budget, page_size=page, context_length=req.context_length,
        max_total_num_tokens=tokens, max_running_requests=running_requests(req, tokens, state_slots),
        req_to_token_row_width=req.req_to_token_row_width, kv_pools=pools, state_pool=state_plan,
        request_table_requests=req.request_table_requests, below_one_request=below_one_request,
    )


def plan_cost(req: PlanRequest, tokens: int, state_slots: int) -> int:
    """Bytes the plan for `tokens` takes from the budget: its own charge (what it allocates, and what the engine
    charges beyond that), the one cost formula."""
    return candidate_plan(req, tokens, state_slots).charged_bytes


def zero_kv_tokens(req: PlanRequest) -> int:
    """The token pool of a model without per-token KV (a pure state-space model): SGLang 0.5.23 gives its pool of
    no bytes --max-total-tokens tokens, else the context length, in whole pages (DefaultPoolConfigurator's
    `_zero_kv_max_tokens`, srt/model_executor/pool_configurator.py); the allocator and the request table index
    them, and the rest of the budget beyond the state slots stays unused."""
    return align_down(req.max_total_tokens or req.context_length, req.page_size)


def _largest_fitting_tokens(req: PlanRequest, state_slots: int) -> int:
    """Largest page multiple T <= the caps with plan_cost(T) <= budget; 0 if not even one page fits. Without a
    per-token pool T is zero_kv_tokens (0 when even that does not fit)."""
    page = req.page_size
    if not req.kv_pools:
        tokens = zero_kv_tokens(req)
        return tokens if plan_cost(req, tokens, state_slots) <= req.budget.budget_bytes else 0
    budget = req.budget.budget_bytes
    per_page = page * max(1, sum(p.bytes_per_token for p in req.kv_pools if p.share == "all"))
    hi = budget // per_page + 1
    if req.max_total_tokens is not None:
        hi = min(hi, req.max_total_tokens // page)
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_cost(req, mid * page, state_slots) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * page


def plan_pool_sizes(req: PlanRequest) -> MemoryPoolConfig:
    """Size every pool for the budget; raises a DoesNotFitError subclass (without suggestions)."""
    budget = req.budget.budget_bytes
    page = req.page_size
    slots = state_slots(req)
    if req.state is not None:
        _check_state_fits(req, slots)
    tokens = _largest_fitting_tokens(req, slots)
    one_request = whole_request_tokens(req)
    if tokens == 0:
        raise BudgetBelowOnePageError(
            f"the KV budget does not hold one page ({page} tokens) plus the request table",
            needed_bytes=plan_cost(req, one_request, slots), available_bytes=budget,
        )
    if tokens < one_request:
        _refuse_below_one_request(req, tokens, one_request, slots)
    _check_windows_fit(req, tokens, slots)
    return candidate_plan(req, tokens, slots, "cap" if tokens < one_request else "refuse")


def _refuse_below_one_request(req: PlanRequest, tokens: int, one_request: int, slots: int) -> None:
    """A pool of `tokens` shorter than one full-context request: refused (the strict rule), or, where the engine
    caps each request at the pool less one token, refused only when that leaves no token."""
    budget = req.budget.budget_bytes
    capped = req.max_total_tokens is not None and tokens == align_down(req.max_total_tokens, req.page_size)
    fix = max_total_tokens_fixes(req) if capped else ()
    if req.below_one_request == "cap":
        smallest = req.minimums.pool_tokens
        if tokens < smallest:
            raise BudgetBelowOneRequestError(
                f"the KV {'pool' if capped else 'budget'} holds {tokens} token{'s' if tokens != 1 else ''}, "
                f"below the {smallest} the engine starts with (a request holds the pool less one token)",
                needed_bytes=plan_cost(req, smallest, slots), available_bytes=budget, suggestions=fix,
            )
        return
    if fix:
        raise BudgetBelowOneRequestError(
            f"--max-total-tokens {req.max_total_tokens} is below one request of --context-length "
            f"{req.context_length} ({one_request:,} tokens); the budget would hold more",
            needed_bytes=plan_cost(req, one_request, slots), available_bytes=budget, suggestions=fix,
        )
    raise BudgetBelowOneRequestError(
        f"the KV budget holds {tokens:,} tokens, fewer than one request of --context-length {req.context_length} "
        f"needs ({one_request:,} tokens)",
        needed_bytes=plan_cost(req, one_request, slots), available_bytes=budget,
    )


def max_total_tokens_fixes(req: PlanRequest) -> tuple[str, ...]:
    """The fix for a --max-total-tokens below one whole request (max_total_tokens_fix), where the strict planner
    plans with it: the one test of that fix, so the refusal and a capped plan's note name it exactly when it plans."""
    whole = whole_request_tokens(req)
    if req.max_total_tokens is None or req.max_total_tokens >= whole:
        return ()
    try:
        plan_pool_sizes(msgspec.structs.replace(req, max_total_tokens=whole, below_one_request="refuse"))
    except DoesNotFitError:
        return ()
    return (max_total_tokens_fix(whole),)


def max_total_tokens_fix(one_request: int) -> str:
    """The fix for a --max-total-tokens below one whole request, in the words every refusal and note uses."""
    return f"--max-total-tokens {one_request} or more (or drop it)"


def whole_request_tokens(req: PlanRequest) -> int:
    """One request's full-pool tokens (one_request_tokens) in whole pages, at least one page."""
    return align_up(max(one_request_tokens(req), 1), req.page_size)


def one_request_tokens(req: PlanRequest) -> int:
    """Full-pool tokens one request of context_length needs. With only sliding layers (one pool holding every token,
    no paired window pool to admit into), a window plus a page, or the whole request when that is shorter."""
    if req.kv_pools and all(p.window is not None for p in req.kv_pools):
        return min(req.context_length, min(p.window for p in req.kv_pools if p.window) + req.page_size)
    return req.context_length


def window_request_tokens(window: int, request_tokens: int, page_size: int) -> int:
    """Tokens one request of `request_tokens` takes in a sliding-window pool paired with a full pool: its last
    `window` tokens (all of it when shorter) plus a page, SGLang 0.5.23's admission charge (min(extend + decode,
    window) + page_size, validate_swa_pool_size in srt/model_executor/pool_configurator.py). The one count of a
    request in a paired window pool: the pool's floor and the requests a plan holds at once both read it."""
    return min(request_tokens, window) + page_size


def _check_state_fits(req: PlanRequest, slots: int) -> None:
    s = req.state
    assert s is not None
    need = (1 + s.slots_per_request) * s.bytes_per_slot
    if slots * s.bytes_per_slot > req.budget.budget_bytes:
        raise DoesNotFitError(
            f"{s.max_slots} state slots (--max-mamba-cache-size, or --max-running-requests with --disable-radix-cache) "
            f"take {format_bytes(slots * s.bytes_per_slot)}, "
            "more than the whole KV budget",
            needed_bytes=slots * s.bytes_per_slot, available_bytes=req.budget.budget_bytes,
        )
    if slots - 1 < s.slots_per_request:
        raise BudgetBelowOneRequestError(
            f"the state share of the budget holds {max(slots - 1, 0)} usable state slots; one request needs "
            f"{s.slots_per_request} ({format_bytes(s.bytes_per_slot)} each)",
            needed_bytes=need, available_bytes=req.budget.budget_bytes,
        )


def _check_windows_fit(req: PlanRequest, tokens: int, slots: int) -> None:
    """A paired sliding-window pool must hold more than one window plus a page: SGLang 0.5.23 admits a request
    only with that much of the pool free, so it refuses a smaller one (validate_swa_pool_size in
    srt/model_executor/pool_configurator.py, whatever the context length)."""
    for p in req.kv_pools:
        if p.share != "swa" or p.window is None:
            continue
        need = window_request_tokens(p.window, p.window, req.page_size) + 1  # a request as long as the window
        have = _pool_tokens(req, p, tokens)
        if have < need:
            raise BudgetBelowOneRequestError(
                f"the sliding-window pool {p.name!r} holds {have:,} tokens, not more than one window "
                f"({p.window:,}) plus a page ({req.page_size}), the least that admits a request",
                needed_bytes=plan_cost(req, tokens, slots) + (need - have) * p.bytes_per_token,
                available_bytes=req.budget.budget_bytes,
            )


def requests_at_context(req: PlanRequest, plan: MemoryPoolConfig) -> int:
    """Requests of `req.context_length` tokens each that `plan` holds at once: its running-request cap (state slots
    included), the token slots of a plan without per-token KV, and every pool's tokens over what one such request
    takes there (plan_pool_sizes' one request in a
    pool of every token; window_request_tokens in a paired sliding-window pool)."""
    one_request = whole_request_tokens(req)
    held = plan.max_running_requests
    if not req.kv_pools:  # without per-token KV the token slots (zero_kv_tokens) still hold each request's tokens
        held = min(held, plan.max_total_num_tokens // one_request)
    for demand, pool in zip(req.kv_pools, plan.kv_pools, strict=True):
        per_request = one_request
        if demand.share == "swa" and demand.window is not None:
            per_request = window_request_tokens(demand.window, req.context_length, req.page_size)
        held = min(held, pool.num_tokens // per_request)
    return held
