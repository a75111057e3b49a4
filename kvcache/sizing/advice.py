"""What would fit: re-run the pure planner with one knob changed (kvcache.sizing.knob_search) and name the values
that work; where no knob works alone, the first combination (a larger --mem-fraction-static with fp8 KV or a shorter
context) that does.

Each suggestion names flags and values that were checked by planning with them, together.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from kvcache.byte_units import GiB, MiB
from kvcache.errors import DoesNotFitError
from kvcache.sizing.memory_budget import MemoryBudget, compute_budget, headroom_bytes
from kvcache.arithmetic import align_down, align_up
from kvcache.sizing.knob_search import (
    fits, largest_fitting_state_slots, longest_fitting_context, most_running_requests_that_run, smallest_fitting_budget,
    smallest_fitting_mamba_ratio, smallest_fitting_mem_fraction, smallest_fitting_swa_ratio, smallest_passing, with_budget,
    with_context,
)
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.sizing.plan_request import PlanRequest


class KeptFree(msgspec.Struct, frozen=True, kw_only=True):
    """What the default mem_fraction_static keeps free for the runtime (activations, CUDA graphs), so that
    a suggested larger fraction says what it gives up instead of passing for a safe value."""

    free_before_load: int
    default_fraction: float
    cuda_graphs: bool = True  # a card's runtime keeps room for graphs too; a host's for activations alone

    def trade(self, fraction: float) -> str:
        """'' when `fraction` keeps at least the default's reserve; else what it keeps and gives up."""
        if fraction <= self.default_fraction:
            return ""
        keeps = headroom_bytes(self.free_before_load, fraction)
        default = headroom_bytes(self.free_before_load, self.default_fraction)
        return (f"keeps {keeps / GiB:.2f} GiB free for {runtime_uses(self.cuda_graphs)} where the default "
                f"{self.default_fraction} keeps {default / GiB:.2f} GiB: it gives that headroom up")


def runtime_uses(cuda_graphs: bool) -> str:
    """What the memory a runtime keeps free is for: a CPU engine captures no CUDA graphs."""
    return "activations and CUDA graphs" if cuda_graphs else "activations"


def mib_at_least(nbytes: int, limit: int) -> int:
    """`nbytes` rounded up to whole MiB (a value a person can type back), unless that passes `limit`."""
    rounded = align_up(nbytes, MiB)
    return rounded if rounded <= limit else nbytes


def size_flag_value(nbytes: int) -> str:
    """A byte count as a size flag's value: '114138MiB' when it is whole MiB, else the bytes."""
    return f"{nbytes // MiB}MiB" if nbytes % MiB == 0 else str(nbytes)


def suggest_kv_cache_memory(req: PlanRequest, free_after_load: int, *, kv_cache_memory: int | None = None,
                            host_total_bytes: int | None = None, host_memory: int | None = None) -> tuple[str, ...]:
    """Fixes for a --kv-cache-memory above what is free: values of it that plan (or what else must change).

    On the CPU (`host_total_bytes`, today's --memory-limit, given) a --memory-limit that leaves the asked bytes
    free comes first: what is free after loading grows byte for byte with the limit. Not one above
    `host_memory`, what the host has (when known): such a limit is refused.
    """
    on_host = host_total_bytes is not None
    out: list[str] = []
    if on_host and kv_cache_memory is not None and fits(with_budget(req, kv_cache_memory)):
        limit = host_limit_rounded(host_total_bytes + kv_cache_memory - free_after_load)
        if host_memory is None or limit <= host_memory:
            out.append(f"--memory-limit {limit // MiB}MiB (keeps --kv-cache-memory, if the host has it)")
    at_most = with_budget(req, free_after_load)
    least = smallest_fitting_budget(req, free_after_load)
    if least is not None:
        ninety = free_after_load * 9 // 10 // MiB * MiB
        uses = runtime_uses(not on_host)
        return (*out, f"--kv-cache-memory {size_flag_value(ninety)} (90% of what is free, leaving "
                f"{(free_after_load - ninety) / GiB:.2f} GiB for {uses})"
                if fits(with_budget(req, ninety)) else
                f"--kv-cache-memory {size_flag_value(free_after_load)} (all that is free: it leaves nothing for {uses})",
                f"--kv-cache-memory {size_flag_value(mib_at_least(least, free_after_load))} "
                "(the least that holds one full-length request)")
    others = suggest_fixes(at_most, budget_for_fraction=None, kv_cache_memory_limit=None, fp8_request=None,
                           on_host=on_host)
    return (*out, *(f"--kv-cache-memory {free_after_load} with {fix}" for fix in others))


HOST_LIMIT_STEP = 64 * MiB


def host_limit_rounded(limit: int) -> int:
    """A suggested --memory-limit rounded up to 64 MiB: a process's resident memory, which the host
    probe measures, moves by a few MiB from one run to the next, so the exact least would be brittle."""
    return align_up(limit, HOST_LIMIT_STEP)


def budget_at_memory_limit(budget: MemoryBudget, limit: int, fraction: float) -> int:
    """The KV budget a CPU engine would get with --memory-limit `limit` (its free bytes grow with it), or 0."""
    grow = limit - budget.total_bytes
    try:
        return compute_budget(total_bytes=limit, free_before_load=budget.free_before_load_bytes + grow,
                              free_after_load=budget.free_after_load_bytes + grow, mem_fraction_static=fraction,
                              kv_cache_memory=None, reserved_bytes=budget.reserved_bytes).budget_bytes
    except DoesNotFitError:
        return 0


def smallest_fitting_memory_limit(req: PlanRequest, fraction_for_limit: Callable[[int], float],
                                  host_memory: int | None = None) -> int | None:
    """On the CPU: the smallest --memory-limit (whole MiB, up to 64x today's and at most `host_memory`, what the
    host has, when known) whose budget plans, or None.

    `fraction_for_limit` gives mem_fraction_static for a host budget of that size (the user's value,
    or SGLang's rule for that size). Not with --kv-cache-memory: a larger limit does not change it.
    """
    b = req.budget
    if b.kv_cache_memory_bytes is not None:
        return None

    def ok(mib: int) -> bool:
        budget = budget_at_memory_limit(b, mib * MiB, fraction_for_limit(mib * MiB))
        return budget > 0 and fits(with_budget(req, budget))

    top = 64 * b.total_bytes // MiB if host_memory is None else min(64 * b.total_bytes, host_memory) // MiB
    mib = smallest_passing(b.total_bytes // MiB + 1, top, ok)
    if mib is None:
        return None
    rounded = host_limit_rounded(mib * MiB)  # unless rounding crosses a card-size threshold that costs more
    return rounded if rounded // MiB <= top and ok(rounded // MiB) else mib * MiB


def suggest_fixes(
    req: PlanRequest,
    *,
    budget_for_fraction: Callable[[float], int] | None,
    kv_cache_memory_limit: int | None,
    fp8_request: PlanRequest | None,
    fraction_for_limit: Callable[[int], float] | None = None,
    on_host: bool = False,
    host_memory: int | None = None,
    kept_free: KeptFree | None = None,
) -> tuple[str, ...]:
    """Checked alternatives, most direct first. On the CPU (`fraction_for_limit` given, or `on_host`)
    a larger --memory-limit is suggested (at most `host_memory`, what the host has), never more devices.
    A --mem-fraction-static above the default's says what runtime headroom it gives up (`kept_free`)."""
    out: list[str] = []
    beyond_host = None  # on a host too small: the limit that plans, for a host that has it
    if fraction_for_limit is not None:
        limit = smallest_fitting_memory_limit(req, fraction_for_limit, host_memory)
        if limit is not None:
            out.append(f"--memory-limit {limit // MiB}MiB (the least that fits, if the host has it)")
        elif host_memory is not None:
            beyond_host = smallest_fitting_memory_limit(req, fraction_for_limit)
    slots = largest_fitting_state_slots(req)
    if slots is not None and slots != req.state.max_slots:  # type: ignore[union-attr]
        out.append(f"--max-mamba-cache-size {slots}")
    mamba_ratio = smallest_fitting_mamba_ratio(req)
    if mamba_ratio is not None:
        out.append(f"--mamba-full-memory-ratio {mamba_ratio:.3f}")
    ratio = smallest_fitting_swa_ratio(req)
    if ratio is not None:
        out.append(f"--swa-full-tokens-ratio {ratio:.3f}")
    if budget_for_fraction is not None:
        fraction = smallest_fitting_mem_fraction(req, budget_for_fraction)
        if fraction is not None:
            trade = kept_free.trade(fraction) if kept_free else ""
            out.append(f"--mem-fraction-static {fraction:.3f}" + (f" ({trade})" if trade else ""))
    if kv_cache_memory_limit is not None:
        need = smallest_fitting_budget(req, kv_cache_memory_limit)
        if need is not None:
            out.append(f"--kv-cache-memory {size_flag_value(mib_at_least(need, kv_cache_memory_limit))} "
                       "(the least that holds one full-length request)")
    if fp8_request is not None and fits(fp8_request):
        tokens = plan_pool_sizes(fp8_request).max_total_num_tokens
        out.append(f"--kv-cache-dtype fp8_e4m3 ({tokens:,} tokens fit)")
    context = longest_fitting_context(req)
    if context is not None:
        out.append(f"--context-length {context} (the longest that fits)")
    requests = most_running_requests_that_run(req)
    if requests is not None:
        plan = plan_pool_sizes(msgspec.structs.replace(req, max_running_requests=requests))
        out.append(f"--max-running-requests {requests} (the most that run: the request table then leaves the pool "
                   f"{plan.max_total_num_tokens:,} tokens"
                   + (f", one request at most {plan.request_token_cap:,})" if plan.request_token_cap is not None else ")"))
    if not out:
        combined = first_fitting_combination(req, budget_for_fraction=budget_for_fraction, fp8_request=fp8_request,
                                             kept_free=kept_free)
        if combined is not None:
            out.append(combined)
    if beyond_host is not None:
        out.append(f"a host with more memory: --memory-limit {beyond_host // MiB}MiB is the least that holds the "
                   f"weights, the runtime's reserve and one full-length request; this host has {host_memory // MiB}MiB")
    if not out and fraction_for_limit is not None:  # the limit searched up to 64x today's (smallest_fitting_memory_limit)
        out.append(f"a host with more memory: no --memory-limit up to {64 * req.budget.total_bytes // MiB}MiB holds "
                   "the weights, the runtime's reserve and one full-length request")
    if not out and on_host:
        out.append(f"a host with more memory: all {req.budget.free_after_load_bytes // MiB}MiB free after loading "
                   "hold no full-length request")
    if not out:
        out.append(MORE_DEVICES)
    return tuple(out)


SHORTEST_SUGGESTED_CONTEXT = 1024
MORE_DEVICES = "a larger --tp-size (or --pp-size) to spread weights and KV over more devices, or a bigger card"


def round_shorter_contexts(req: PlanRequest) -> list[int]:
    """Context lengths to pair with another knob, longest first: the powers of two below the current
    one down to 1,024 tokens, each a page multiple (round values a person would pick)."""
    out: list[int] = []
    power = 1 << ((req.context_length - 1).bit_length() - 1) if req.context_length > 1 else 0
    while power >= SHORTEST_SUGGESTED_CONTEXT:
        ctx = align_down(power, req.page_size)
        if ctx >= req.page_size and ctx not in out:
            out.append(ctx)
        power //= 2
    return out


def first_fitting_combination(req: PlanRequest, *, budget_for_fraction: Callable[[float], int] | None,
                              fp8_request: PlanRequest | None, kept_free: KeptFree | None = None) -> str | None:
    """When no single knob plans (typically: the weights leave no room at the default fraction): the first
    larger --mem-fraction-static that plans together with fp8 KV (keeping the context), else with the
    longest round shorter context, else with both; all values checked by planning with them together."""
    if budget_for_fraction is None:
        return None
    contexts = round_shorter_contexts(req)
    fp8 = "--kv-cache-dtype fp8_e4m3 "
    variants: list[tuple[str, PlanRequest, int | None]] = [(fp8, fp8_request, None)] if fp8_request else []
    variants += [("", with_context(req, ctx), ctx) for ctx in contexts]
    if fp8_request is not None:
        variants += [(fp8, with_context(fp8_request, ctx), ctx) for ctx in contexts]
    for flags, variant, context in variants:
        fraction = smallest_fitting_mem_fraction(variant, budget_for_fraction)
        if fraction is not None:
            tokens = plan_pool_sizes(with_budget(variant, budget_for_fraction(fraction))).max_total_num_tokens
            context_flag = "" if context is None else f"--context-length {context} "
            trade = kept_free.trade(fraction) if kept_free else ""
            return (f"--mem-fraction-static {fraction:.3f} {flags}{context_flag}(together: {tokens:,} tokens fit"
                    + (f", {trade})" if trade else ")"))
    return None
