"""What a plan's caps leave unusable: where something other than the pool limits what is in use.

Three cases the report names, with the bytes:
- the pool holds fewer tokens than one full-context request, and the engine runs so (SGLang 0.5.23): each
  request is capped below the context; the note names what would let a full-length request fit;
- running requests bind (state slots, --max-running-requests): R requests of at most `context` tokens
  use R * context tokens at once; the rest of the pool can hold only cached prefixes;
- a --max-running-requests above the default makes the request table (a row of `context` int32s a
  request, SGLang 0.5.23's shape) take budget the pool would otherwise hold: the tokens given up;
- a model without per-token KV (a pure state-space model) has token slots for the context alone (SGLang 0.5.23's
  default), so fewer full-length requests run at once than its state slots serve: the --max-total-tokens that
  lets them all run, checked by planning with it.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from kvcache.errors import DoesNotFitError
from kvcache.byte_units import format_bytes
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory


class CapacityNote(msgspec.Struct, frozen=True, kw_only=True):
    """One cap that leaves part of the pool unusable by running requests, with the bytes."""

    cap: str  # "request_length", "state_slots", "max_running_requests", "request_table" or "token_slots"
    message: str  # one line for the report
    tokens: int  # tokens the cap leaves out (of running requests, or of the pool)
    bytes: int  # what those tokens cost in the pools that hold every token (or the table's extra bytes)
    fixes: tuple[str, ...] = ()  # flags and values that lift the cap, each checked by planning with it


def capacity_notes(sizing: WorkerSizing, plan: MemoryPoolConfig) -> tuple[CapacityNote, ...]:
    """The caps that bind this plan below its pool, each with what it leaves out."""
    notes = (_request_capped(sizing, plan), _requests_bind(sizing, plan), _table_takes_the_pool(sizing, plan),
             _token_slots_bind(sizing, plan))
    return tuple(n for n in notes if n is not None)


def _request_capped(sizing: WorkerSizing, plan: MemoryPoolConfig) -> CapacityNote | None:
    cap, context = plan.request_token_cap, plan.context_length
    if cap is None:
        return None
    memory = WorkerMemory.of_budget(plan.budget)
    fixes = sizing.full_request_fixes(memory)
    left = context - cap
    return CapacityNote(cap="request_length", tokens=left, bytes=left * plan.bytes_per_token, fixes=fixes, message=(
        f"one request can hold at most {cap:,} tokens, prompt and output (the pool's {plan.max_total_num_tokens:,} "
        f"less one), not --context-length {context}: {sizing.engine.label} runs so and refuses longer requests"
        + (f"; for a full-length request: {'; '.join(fixes)}" if fixes else "")))


def _requests_bind(sizing: WorkerSizing, plan: MemoryPoolConfig) -> CapacityNote | None:
    if plan.every_layer_slides:  # a request keeps one window
        return None
    requests, context = plan.max_running_requests, plan.context_length
    in_use = requests * context
    left = plan.max_total_num_tokens - in_use
    if left <= 0:
        return None
    state = plan.state_pool
    if state is not None and requests == state.request_cap:
        cap, why = "state_slots", (f"the state slots ({state.usable_slots:,} usable, {state.slots_per_request} a request) "
                                   f"serve {requests:,} running requests")
    elif sizing.settings.max_running_requests is not None:
        cap, why = "max_running_requests", f"--max-running-requests caps running requests at {requests:,}"
    else:
        cap, why = "max_running_requests", f"the default request cap is {requests:,} running requests"
    nbytes = left * plan.bytes_per_token
    return CapacityNote(cap=cap, tokens=left, bytes=nbytes, message=(
        f"{why}: at most {requests:,} x {context:,} = {in_use:,} tokens are in use at once; the other {left:,} "
        f"tokens ({format_bytes(nbytes)}) can hold only cached prefixes"))


def _table_takes_the_pool(sizing: WorkerSizing, plan: MemoryPoolConfig) -> CapacityNote | None:
    asked = sizing.settings.max_running_requests
    if asked is None:
        return None
    if sizing.settings.max_total_tokens is not None:  # the user fixed the pool's tokens: the table takes none of them
        return None
    default = replace(sizing, settings=sizing.settings.replace(max_running_requests=None))
    try:
        baseline = default.engine.plan(default.plan_request(default.layout(), plan.budget))
    except DoesNotFitError:  # no default plan to compare with: nothing to say
        return None
    lost = baseline.max_total_num_tokens - plan.max_total_num_tokens
    if lost <= 0:
        return None
    extra = plan.req_to_token_bytes - baseline.req_to_token_bytes
    return CapacityNote(cap="request_table", tokens=lost, bytes=extra, message=(
        f"--max-running-requests {asked} (capped at {plan.max_running_requests:,}: at most tokens // 2, SGLang 0.5.23's "
        f"rule) makes the request table {format_bytes(plan.req_to_token_bytes)}; the pool holds {lost:,} fewer tokens "
        f"than at the default {baseline.max_running_requests:,} requests ({baseline.max_total_num_tokens:,})"))


def _token_slots_bind(sizing: WorkerSizing, plan: MemoryPoolConfig) -> CapacityNote | None:
    if plan.kv_pools:
        return None
    requests, context, slots = plan.max_running_requests, plan.context_length, plan.max_total_num_tokens
    held = slots // context
    if held >= requests:
        return None
    wanted = _all_running_at_full_length(sizing, plan.budget, requests * context, context)
    fixes = (f"--max-total-tokens {wanted}",) if wanted is not None else ()
    return CapacityNote(cap="token_slots", tokens=requests * context - held * context, bytes=0, fixes=fixes, message=(
        f"the {slots:,} token slots ({sizing.engine.label}'s default without per-token KV: the context length; they "
        f"hold no bytes) fit {held:,} request{'' if held == 1 else 's'} of {context:,} tokens at once, while "
        f"{requests:,} may run" + (f"; for all of them at full length, {wanted:,} token slots: {fixes[0]}" if fixes else "")))


def _all_running_at_full_length(sizing: WorkerSizing, budget: MemoryBudget, tokens: int, context: int) -> int | None:
    """The --max-total-tokens whose plan holds all its running requests at full length, or None where none fits:
    more token slots may raise the running-request cap too (SGLang's clamp(T * 512 // context, 2048, 4096)), so
    plan again with the slots the new cap needs until they agree (a few rounds: the cap is bounded)."""
    for _ in range(4):
        with_slots = replace(sizing, settings=sizing.settings.replace(max_total_tokens=tokens))
        try:
            replanned = with_slots.engine.plan(with_slots.plan_request(with_slots.layout(), budget))
        except DoesNotFitError:
            return None
        if replanned.max_total_num_tokens // context >= replanned.max_running_requests:
            return tokens
        tokens = replanned.max_running_requests * context
    return None
