"""The reference model's worst-case steps: what the engine's largest allocations come from.

- `prefill_chunk`: one request feeding --chunked-prefill-size new tokens (capped by the context
  length and the pool), with logits for its last token, as a chunked prefill runs. The prefix is
  empty: the reference reads a prefix by gathering its K/V per layer, which a paged prefill kernel
  does not, so a prefix would measure the reference rather than the engine.
- `eager_decode`: a decode batch of max_running_requests, when that is above the largest captured
  graph (a graph's memory is taken at capture and counted there); logits for every request.
Mixed chunk + decode batches and logprobs over a chunk are not scheduled by this engine, so they are
not listed. A family with no reference forward is refused when the step is built, with the families
that have one.
"""

from __future__ import annotations

from typing import Any

import torch


class ReferenceWorstCaseStep:
    """A WorstCaseStep (kvcache.runtime.measured_headroom) over a ModelRunner's reference forward and pools."""

    def __init__(self, *, runner: Any, chunked_prefill_size: int, decode_batch: int, largest_graph_batch: int) -> None:
        runner.decoder()  # UnsupportedModelError for a family (or weight format) the reference cannot run
        self.runner = runner
        plan = runner.memory_pool_config
        self.prefill_tokens = min(chunked_prefill_size, plan.context_length, plan.max_total_num_tokens - plan.page_size)
        self.decode_batch = min(decode_batch, runner.req_to_token_pool.size)  # the final plan may run more than this one
        self.largest_graph_batch = largest_graph_batch

    def names(self) -> tuple[str, ...]:
        eager = self.decode_batch > self.largest_graph_batch
        return ("prefill_chunk", "eager_decode") if eager else ("prefill_chunk",)

    def run(self, name: str) -> None:
        """One step through the pools; its requests are released after it (the allocator as it was)."""
        runner = self.runner
        requests = runner.decode_requests()
        vocab = runner.model_config.vocab_size
        device = runner.device
        if name == "prefill_chunk":
            rows = requests.add(1)
            ids = torch.randint(0, vocab, (self.prefill_tokens,), device=device)
            out = runner.forward_extend(requests.extend(rows, [ids]))
        elif name == "eager_decode":
            rows = requests.add(self.decode_batch)
            out = runner.forward_decode(requests.step(rows, torch.randint(0, vocab, (len(rows),), device=device)))
        else:
            raise ValueError(f"no worst-case step {name!r}; steps: {', '.join(self.names())}")
        del out
        requests.release(rows)
