"""Weights that do not fit: the memory that would hold them and a full-length request, checked by planning.

On a card: the smallest known card that holds them at this TP size (`--gpu NAME` for a dry run).
On the CPU: the --memory-limit at which a worker plans, weights loaded.

A refusal on a host names a limit that works: the least (in 64 MiB steps: the process's resident memory,
which the host probe measures, moves by some KiB from run to run) at which this worker's weights, the
runtime's reserve and one full-length request plan together, re-planned there. A limit only the weights
fit is not suggested: with it the next answer is "nothing is left for the KV cache". Where the host has
less than that limit, the line says so and names both numbers.
"""

from __future__ import annotations

from kvcache.arithmetic import ceil_div
from kvcache.byte_units import GiB, MiB
from kvcache.inputs.cards import CUDA_KERNEL_LOAD_BYTES, KNOWN_CARDS, card_named
from kvcache.sizing.advice import HOST_LIMIT_STEP
from kvcache.sizing.knob_search import smallest_passing
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory

LARGEST_SUGGESTED_GROWTH = 64  # a limit is looked for up to this many times the weights and today's limit


def memory_at_limit(limit_bytes: int, *, used_bytes: int, weights_bytes: int) -> WorkerMemory:
    """What a CPU worker reads with --memory-limit `limit_bytes`: free grows byte for byte with the limit, less what
    the process holds already (`used_bytes`) and, after loading, its weights."""
    return WorkerMemory(total_bytes=limit_bytes, free_before_load=limit_bytes - used_bytes,
                        free_after_load=limit_bytes - used_bytes - weights_bytes)


def least_memory_limit(sizing: WorkerSizing, *, used_bytes: int, weights_bytes: int) -> int | None:
    """The least --memory-limit (a multiple of 64 MiB) at which `sizing` plans with its weights loaded, or None
    within LARGEST_SUGGESTED_GROWTH times the weights and what the process holds."""
    def plans(steps: int) -> bool:  # a full-length request, not one capped
        memory = memory_at_limit(steps * HOST_LIMIT_STEP, used_bytes=used_bytes, weights_bytes=weights_bytes)
        return holds_a_full_request(sizing, memory)

    lo = ceil_div(used_bytes + weights_bytes + 1, HOST_LIMIT_STEP)
    steps = smallest_passing(lo, LARGEST_SUGGESTED_GROWTH * lo, plans)
    return None if steps is None else steps * HOST_LIMIT_STEP


def memory_limit_fixes(sizing: WorkerSizing, *, used_bytes: int, weights_bytes: int,
                       host_memory: int | None) -> tuple[str, ...]:
    """The refusal's values on a host: the least --memory-limit that plans (or, beyond what the host has, a host
    with that much); never a bare "more memory"."""
    limit = least_memory_limit(sizing, used_bytes=used_bytes, weights_bytes=weights_bytes)
    if limit is None:
        return (f"a host with over {LARGEST_SUGGESTED_GROWTH}x the memory: no --memory-limit up to "
                f"{LARGEST_SUGGESTED_GROWTH * (used_bytes + weights_bytes) // MiB}MiB holds the weights, the runtime's "
                "reserve and one full-length request",)
    what = "the least that holds the weights, the runtime's reserve and one full-length request"
    if host_memory is not None and limit > host_memory:
        return (f"a host with more memory: --memory-limit {limit // MiB}MiB (ServerArgs.memory_limit from Python) is "
                f"{what}; this host has {host_memory // MiB}MiB",)
    return (f"--memory-limit {limit // MiB}MiB (ServerArgs.memory_limit from Python; {what})",)


def holds_a_full_request(sizing: WorkerSizing, memory: WorkerMemory) -> bool:
    """Whether `sizing` plans with this memory and its pools hold one request of the whole context."""
    plan = sizing.plan_or_none(memory) if memory.free_after_load > 0 else None
    return plan is not None and plan.request_token_cap is None


def card_fixes(sizing: WorkerSizing, *, weights_bytes: int, dry_run: bool, only_found: bool = False) -> tuple[str, ...]:
    """On a card: the smallest known card on which these weights (and the kernels loading them adds to the context),
    the runtime's reserve and one full-length request plan at this TP size; `--gpu NAME` for a dry run. An engine
    whose answer is its own block plan (vLLM) is checked for the weights alone. Where no card does, a line saying
    so, or nothing when `only_found` (a --tp-size already suggested plans: the line would only contradict it)."""
    pools = sizing.engine.plans_pools
    held = "the runtime's reserve and one full-length request" if pools else "(the engine's own blocks need more)"
    for name in sorted(KNOWN_CARDS, key=lambda known: KNOWN_CARDS[known].budget_total_bytes):
        card = card_named(name)
        total, free = card.total_bytes, card.free_bytes
        memory = WorkerMemory(total_bytes=total, free_before_load=free, reported_total_bytes=card.device_capacity_bytes,
                              free_after_load=free - weights_bytes - CUDA_KERNEL_LOAD_BYTES)
        if holds_a_full_request(sizing, memory) if pools else memory.free_after_load > 0:
            why = f"{total / GiB:.0f} GiB, the smallest known card that holds the weights{', ' if pools else ' '}{held} " \
                  "at this --tp-size"
            return (f"--gpu {name} ({why})",) if dry_run else (f"a card such as {name} ({why})",)
    return () if only_found else (
        "no known card holds the weights and one full-length request at this --tp-size: a larger --tp-size or "
        "--pp-size",)
