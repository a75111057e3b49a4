"""The reference model's worst-case steps: what the engine's largest allocations come from.

- `prefill_chunk`: one request feeding --chunked-prefill-size new tokens (capped by the context
  length and the pool), asking for prompt logprobs: logits and their log-softmax for the chunk's
  last PROMPT_LOGPROB_TOKENS tokens (SGLang 0.5.23 computes input logprobs that many tokens at a
  time), as a chunked prefill of a request with `logprob_start_len` runs. The prefix is empty: the
  reference reads a prefix by gathering its K/V per layer, which a paged prefill kernel does not, so a
  prefix would measure the reference rather than the engine.
- `eager_decode`: a decode batch of max_running_requests, when that is above the largest batch a captured
  graph serves (a graph's memory is taken at capture and counted there; with --disable-cuda-graph-padding
  none is served, as batches between captured sizes run eagerly), sampled with logprobs.
- `mixed_chunk` (with --enable-mixed-chunk): the chunk with the running decode requests riding in it, one
  token each over a one-token context (kvcache.sizing.worst_case_shapes), sampled without logprobs, as
  SGLang mixes only steps that ask for none.
- `mla_context` (MLA models): the chunk prefilled over a cached context that fills SGLang's chunked-context
  capacity, which MLA up-projects to per-head keys and values (kvcache.sizing.worst_case_shapes); the
  context's slots are taken and left unwritten (their values do not change what the step holds).
The others run the sampler as an engine does for requests asking for logprobs (`sample_with_logprobs`),
as vLLM 0.34's sizing warm-up does too: a request may ask for them, and the headroom must hold it.
A family with no reference forward is refused when the step is built, with the families that have one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from app.forward.decoder import MLADecoder
from kvcache.sizing.measured_prediction import PROMPT_LOGPROB_TOKENS
from kvcache.sizing.worst_case_shapes import mixed_chunk_riders, mla_context_tokens


def sample_with_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Next tokens from float32 logits [rows, vocab], with each row's log-probabilities: the probabilities are
    written over the logits (the softmax's output is a temporary of the same size, as in SGLang's sampler), then
    their log is a third such tensor. Which token is taken does not matter here; what the step holds does."""
    logits.copy_(torch.softmax(logits, dim=-1))
    logprobs = torch.log(logits)
    return logprobs.argmax(dim=-1)


def sample_without_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Next tokens from float32 logits [rows, vocab] for requests asking no logprobs: the probabilities (a
    temporary of the logits' size) and no log of them."""
    return torch.softmax(logits, dim=-1).argmax(dim=-1)


class ReferenceWorstCaseStep:
    """A WorstCaseStep (kvcache.runtime.measured_headroom) over a ModelRunner's reference forward and pools."""

    def __init__(self, *, runner: Any, chunked_prefill_size: int, decode_batch: int, largest_graph_batch: int,
                 mixed_chunk: bool) -> None:
        decoder = runner.decoder()  # UnsupportedModelError for a family (or weight format) the reference cannot run
        self.runner = runner
        plan = runner.memory_pool_config
        pool_tokens = plan.max_total_num_tokens - plan.page_size
        self.prefill_tokens = min(chunked_prefill_size, plan.context_length, pool_tokens)
        self.logprob_tokens = min(self.prefill_tokens, PROMPT_LOGPROB_TOKENS)
        self.decode_batch = min(decode_batch, runner.req_to_token_pool.size)  # the final plan may run more than this one
        self.largest_graph_batch = largest_graph_batch
        self.mixed_riders = mixed_chunk_riders(prefill_tokens=self.prefill_tokens, decode_batch=self.decode_batch,
                                               pool_tokens=pool_tokens, page_size=plan.page_size) if mixed_chunk else 0
        self.context_tokens = mla_context_tokens(prefill_tokens=self.prefill_tokens, context_length=plan.context_length,
                                                 pool_tokens=pool_tokens) if isinstance(decoder, MLADecoder) else 0

    def names(self) -> tuple[str, ...]:
        eager = self.decode_batch > self.largest_graph_batch
        return ("prefill_chunk",) + ("eager_decode",) * eager + ("mixed_chunk",) * bool(self.mixed_riders) \
            + ("mla_context",) * bool(self.context_tokens)

    def run(self, name: str) -> None:
        """One step through the pools, sampled; its requests are released after it (the allocator as it was)."""
        runner = self.runner
        requests = runner.decode_requests()
        if name not in self.names():
            raise ValueError(f"no worst-case step {name!r}; steps: {', '.join(self.names())}")
        if name == "eager_decode":
            rows = requests.add(self.decode_batch)
            out = runner.forward_decode(requests.step(rows, self._ids(len(rows))))
        elif name == "mixed_chunk":
            rows = requests.add(self.mixed_riders + 1)
            riders = rows[1:]
            requests.extend(riders, [self._ids(1)] * len(riders))  # each rider's context: slots taken, not run
            prefill = self.prefill_tokens - self.mixed_riders
            out = runner.forward_extend(requests.extend(rows, [self._ids(prefill)] + [self._ids(1)] * len(riders)))
        else:
            rows = requests.add(1)
            if name == "mla_context":
                requests.extend(rows, [self._ids(self.context_tokens)])  # the cached context: slots taken, not run
            batch = requests.extend(rows, [self._ids(self.prefill_tokens)])
            tail = torch.arange(self.prefill_tokens - self.logprob_tokens, self.prefill_tokens, device=runner.device)
            out = runner.forward_extend(dataclasses.replace(batch, logit_rows=tail))
        (sample_without_logprobs if name == "mixed_chunk" else sample_with_logprobs)(out)
        del out
        requests.release(rows)

    def _ids(self, count: int) -> torch.Tensor:
        return torch.randint(0, self.runner.model_config.vocab_size, (count,), device=self.runner.device)
