"""SGLang 0.5.23's start-up minimums: what its own checks refuse before it serves, each citing its source file.

Below them SGLang stops at start-up, so no plan is made there and no suggestion goes there.
- srt/managers/tp_worker.py (TpModelWorker, after the pools are built): max_req_len = min(context_len - 1,
  pool tokens - 1) and `assert max_req_len > 0, "Memory pool size is too small"`: a request must hold at least one
  token after the one reserved, so the context and the pool are each at least 2 tokens.
- srt/arg_groups/validation_hook.py: `assert chunked_prefill_size % page_size == 0` ("chunked_prefill_size must be
  divisible by page_size"), for a --chunked-prefill-size given and, on a card, for the default it sets by the
  card's size (the page may be the model's: DSA pages at 64).
- One decode step of a draft allocates its KV slots in each request (get_alloc_len_per_decode,
  kvcache.engines.sglang_request_table): a step that takes more slots than a request of the context holds cannot
  run even once, and its request-table rows alone outgrow any card (2e9 steps: a 104 GiB table for 25 tokens).
"""

from __future__ import annotations

import msgspec

from kvcache.engines.sglang_request_table import decode_allocation_per_request
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.sizing.plan_request import StartupMinimums

SGLANG_MINIMUMS = StartupMinimums(context_length=2, pool_tokens=2)  # tp_worker.py: assert max_req_len > 0
DEFAULT_CHAIN = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}  # SGLang's
# EAGLE defaults without any given (a chain of 3 steps verifying 4 tokens)


def draft_step_refusal(context_length: int, settings: SizingSettings) -> str | None:
    """A draft whose one decode step allocates more KV slots per request than a request of the context holds;
    the fix is SGLang's default chain where it fits the context (checked with the same rule), else a context."""
    if not settings.speculative:
        return None
    slots = decode_allocation_per_request(settings)
    if slots < context_length:
        return None
    chain = msgspec.structs.replace(settings, **DEFAULT_CHAIN)
    if decode_allocation_per_request(chain) < context_length:
        fix = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in DEFAULT_CHAIN.items() if getattr(settings, k) != v)
        fix += " (SGLang's default chain)"
    else:
        fix = f"--context-length {slots + 1} or more, or no --speculative-algorithm"
    return (f"a draft step of --speculative-num-steps {settings.speculative_num_steps} x --speculative-eagle-topk "
            f"{settings.speculative_eagle_topk} (--speculative-num-draft-tokens {settings.speculative_num_draft_tokens}) "
            f"allocates {slots:,} KV slots per request, not fewer than one request of --context-length "
            f"{context_length:,} holds; use {fix}")


def chunk_page_refusal(settings: SizingSettings, default_chunk: int | None = None) -> str | None:
    """A --chunked-prefill-size the page size does not divide (validation_hook.py's assert), with the nearest that
    it does: the chunk rounded down to whole pages, or one page. Where no chunk is given, the assert reads the
    card's default (`default_chunk`, None off a card): then the largest page size that divides it."""
    chunk, page = settings.chunked_prefill_size, settings.page_size
    if chunk is None:
        if default_chunk is None or default_chunk % page == 0:
            return None
        fit = next(d for d in range(min(page, default_chunk), 0, -1) if default_chunk % d == 0)
        return (f"--page-size {page} does not divide SGLang 0.5.23's default --chunked-prefill-size on this card "
                f"({default_chunk:,}), which it asserts at start-up; use --page-size {fit}")
    if chunk % page == 0:
        return None
    return (f"--chunked-prefill-size {chunk} is not a multiple of the page size {page}, which SGLang 0.5.23 asserts "
            f"at start-up; use --chunked-prefill-size {max(page, chunk // page * page)}")
