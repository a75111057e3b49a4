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
Both run the sampler as an engine does for requests asking for logprobs (`sample_with_logprobs`),
as vLLM 0.34's profile run does too: a request may ask for them, and the headroom must hold it.
Mixed chunk + decode steps are not run: with --enable-mixed-chunk the headroom stays the fraction's
(kvcache.sizing.post_capture_eligibility). A family with no reference forward is refused when the
step is built, with the families that have one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kvcache.sizing.measured_prediction import PROMPT_LOGPROB_TOKENS


def sample_with_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Next tokens from float32 logits [rows, vocab], with each row's log-probabilities: the probabilities are
    written over the logits (the softmax's output is a temporary of the same size, as in SGLang's sampler), then
    their log is a third such tensor. Which token is taken does not matter here; what the step holds does."""
    logits.copy_(torch.softmax(logits, dim=-1))
    logprobs = torch.log(logits)
    return logprobs.argmax(dim=-1)


class ReferenceWorstCaseStep:
    """A WorstCaseStep (kvcache.runtime.measured_headroom) over a ModelRunner's reference forward and pools."""

    def __init__(self, *, runner: Any, chunked_prefill_size: int, decode_batch: int, largest_graph_batch: int) -> None:
        runner.decoder()  # UnsupportedModelError for a family (or weight format) the reference cannot run
        self.runner = runner
        plan = runner.memory_pool_config
        self.prefill_tokens = min(chunked_prefill_size, plan.context_length, plan.max_total_num_tokens - plan.page_size)
        self.logprob_tokens = min(self.prefill_tokens, PROMPT_LOGPROB_TOKENS)
        self.decode_batch = min(decode_batch, runner.req_to_token_pool.size)  # the final plan may run more than this one
        self.largest_graph_batch = largest_graph_batch

    def names(self) -> tuple[str, ...]:
        eager = self.decode_batch > self.largest_graph_batch
        return ("prefill_chunk", "eager_decode") if eager else ("prefill_chunk",)

    def run(self, name: str) -> None:
        """One step through the pools, sampled; its requests are released after it (the allocator as it was)."""
        runner = self.runner
        requests = runner.decode_requests()
        vocab = runner.model_config.vocab_size
        device = runner.device
        if name == "prefill_chunk":
            rows = requests.add(1)
            ids = torch.randint(0, vocab, (self.prefill_tokens,), device=device)
            batch = requests.extend(rows, [ids])
            tail = torch.arange(self.prefill_tokens - self.logprob_tokens, self.prefill_tokens, device=device)
            out = runner.forward_extend(dataclasses.replace(batch, logit_rows=tail))
        elif name == "eager_decode":
            rows = requests.add(self.decode_batch)
            out = runner.forward_decode(requests.step(rows, torch.randint(0, vocab, (len(rows),), device=device)))
        else:
            raise ValueError(f"no worst-case step {name!r}; steps: {', '.join(self.names())}")
        sample_with_logprobs(out)
        del out
        requests.release(rows)
