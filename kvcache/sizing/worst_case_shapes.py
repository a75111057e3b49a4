"""The shapes of the worst-case steps a measured bootstrap runs, as plain numbers (the step and the dry run share them).

- A mixed chunk (SGLang 0.5.23's --enable-mixed-chunk): the running decode requests ride in a prefill
  chunk, one token each, and take their tokens from the chunk (`PrefillAdder`: `rem_chunk_tokens -=
  num_mixed_decode_tokens`, srt/managers/schedule_policy.py), so the step still feeds one chunk of tokens
  but asks logits for every rider. SGLang mixes only when no request asks for logprobs (scheduler.py's
  mixed-chunk condition), so the riders sample without them.
- MLA's chunked context: an MLA prefill over a cached prefix up-projects that prefix to per-head keys
  and values (SGLang's MHA_ONE_SHOT / MHA_CHUNKED_KV, srt/models/deepseek_common/attention_forward_methods/
  forward_mha.py): up to SGLANG_MAX_KV_CHUNK_CAPACITY = 128 Ki tokens at once (srt/environ.py), and only
  from SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD = 8,192 prefix tokens (below, the absorbed MLA kernel reads
  the latents in place). vLLM 0.34 sizes its workspace min(max(8 x max_model_len, 4 x max_num_seqs x
  block_size), 64 Ki) tokens (MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size,
  model_executor/layers/attention/mla_attention.py) and its sizing warm-up fills it once
  (v1/worker/gpu/warmup.py, run_context_prefill_warmup); this engine prefills as SGLang does, so its step
  fills SGLang's capacity, with the full chunk as the new tokens (a long prompt's later chunk).
"""

from __future__ import annotations

MLA_CONTEXT_CAPACITY_TOKENS = 128 * 1024  # SGLang 0.5.23: SGLANG_MAX_KV_CHUNK_CAPACITY's default
MLA_CONTEXT_THRESHOLD_TOKENS = 8192  # SGLang 0.5.23: SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD's default


def mixed_chunk_riders(*, prefill_tokens: int, decode_batch: int, pool_tokens: int, page_size: int) -> int:
    """How many decode requests ride in the worst mixed chunk: all running but the prefilled one, while the
    chunk keeps at least one prefill token and the pool holds the chunk and each rider's two tokens (its
    context and its new token, in whole pages); 0: no mixed step."""
    per_rider = page_size * -(-2 // page_size)
    fit = (pool_tokens - prefill_tokens - page_size) // (per_rider - 1)
    return max(min(decode_batch - 1, prefill_tokens - 1, fit), 0)


def mla_context_tokens(*, prefill_tokens: int, context_length: int, pool_tokens: int) -> int:
    """The cached context the MLA context step prefills its chunk over: as much as SGLang up-projects at once
    that one request (context + chunk) can hold in its context and the pool; 0 below SGLang's threshold."""
    context = min(MLA_CONTEXT_CAPACITY_TOKENS, min(context_length, pool_tokens) - prefill_tokens)
    return context if context >= MLA_CONTEXT_THRESHOLD_TOKENS else 0
