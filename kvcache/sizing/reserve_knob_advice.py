"""A prefill chunk or a graph batch so large that the derived fraction leaves the KV cache nothing: the largest
--chunked-prefill-size and --cuda-graph-max-bs with which the worker plans one full-length request.

SGLang derives --mem-fraction-static from the runtime's reserve, which grows with the chunk (activations) and the
largest graph batch; a value given far above what the card holds derives a fraction that keeps most of the card
free, and the refusal's other fixes (more devices, a bigger fraction) miss the cause. Each value named here was
planned (the search re-runs the worker's planner), and it stays a multiple of the page (SGLang asserts it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvcache.errors import ConfigError
from kvcache.sizing.knob_search import largest_passing
from kvcache.sizing.worker_memory import WorkerMemory

RESERVE_KNOBS = (("--chunked-prefill-size", "chunked_prefill_size"), ("--cuda-graph-max-bs", "cuda_graph_max_bs"))


def reserve_knob_fixes(sizing: Any, memory: WorkerMemory) -> tuple[str, ...]:
    """For each reserve knob the user set while the fraction is derived (neither --mem-fraction-static nor
    --kv-cache-memory given): the largest smaller value with which `sizing` (a WorkerSizing) plans a full-length
    request in `memory`; none where even the smallest does not."""
    s = sizing.settings
    if s.mem_fraction_static is not None or s.kv_cache_memory is not None:
        return ()
    out = []
    for flag, field in RESERVE_KNOBS:
        given = getattr(s, field)
        step = s.page_size if field == "chunked_prefill_size" else 1
        if given is None or given < 2 * step:
            continue

        def plans(n: int, field: str = field, step: int = step) -> bool:
            at = replace(sizing, settings=s.replace(**{field: n * step}))
            try:
                plan = at.plan_or_none(memory)
            except ConfigError:  # a value the engine refuses at start-up is no fix
                return False
            return plan is not None and plan.request_token_cap is None

        n = largest_passing(1, (given - 1) // step, plans)
        if n is not None:
            out.append(f"{flag} {n * step} (the largest with which the fraction derived from it leaves the KV cache "
                       f"a full-length request; {given:,} keeps that memory free for the runtime)")
    return tuple(out)
