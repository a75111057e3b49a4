"""Request and batch objects with the fields SGLang 0.5.23's cache helpers read, for benchmarks/sglang_radix_trace.py.

SGLang's Req and ScheduleBatch carry the whole server (sampling, logprobs, multimodal inputs); its radix
cache, match_kv_cache, checkpoint_kv_cache, release_kv_cache, alloc_for_extend and alloc_for_decode read
only these fields. The request's KV record is SGLang's own ReqKvInfo, passed in.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch


@dataclass
class Req:
    """The fields of SGLang's Req that its cache helpers read; `kv` is SGLang's own ReqKvInfo."""

    rid: str
    origin_input_ids: array
    kv: Any
    output_ids: array = field(default_factory=lambda: array("q"))
    full_untruncated_fill_ids: array = field(default_factory=lambda: array("q"))
    extra_key: Any = None
    cache_salt: Any = None
    priority: Any = None
    lock: Any = None
    last_node: Any = None
    prefix_len: int = 0
    extend_end: int = 0
    finished_reason: Any = None
    finished_len: Any = None
    skip_radix_cache_insert: bool = False

    def finished(self) -> bool:
        return self.finished_reason is not None

    def _compute_max_prefix_len(self, input_len: int) -> int:
        return input_len - 1  # one token left to compute, so the prefill yields logits

    def refresh_fill_ids(self) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids

    def owned_kv_len(self) -> int:
        return self.kv.kv_committed_len


@dataclass
class Batch:
    """The fields of SGLang's ScheduleBatch that alloc_for_extend / alloc_for_decode read."""

    reqs: list[Req]
    tree_cache: Any
    req_to_token_pool: Any
    device: str = "cpu"
    hisparse_coordinator: Any = None
    model_config: Any = field(default_factory=lambda: SimpleNamespace(is_encoder_decoder=False))

    def is_dllm(self) -> bool:
        return False

    def maybe_evict_swa(self) -> None:
        """Free what fell out of each request's window, as SGLang's batch does, in one free group."""
        if not self.tree_cache.supports_swa():
            return
        allocator = self.tree_cache.token_to_kv_pool_allocator
        allocator.free_group_begin()
        for req in self.reqs:
            if req.kv.holds_kv:
                self.tree_cache.evict_sliding_windows(req, req.kv.kv_committed_len)
        allocator.free_group_end()

    def for_extend(self) -> Batch:
        self.prefix_lens = [r.prefix_len for r in self.reqs]
        self.extend_lens = [r.extend_end - r.prefix_len for r in self.reqs]
        self.extend_num_tokens = sum(self.extend_lens)
        return self._lengths([r.extend_end for r in self.reqs])

    def for_decode(self) -> Batch:
        self._lengths([r.kv.kv_committed_len for r in self.reqs])
        self.req_pool_indices_cpu = torch.tensor([r.kv.req_pool_idx for r in self.reqs], dtype=torch.int64)
        self.req_pool_indices = self.req_pool_indices_cpu.to(self.device)
        return self

    def _lengths(self, lens: list[int]) -> Batch:
        self.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        self.seq_lens = self.seq_lens_cpu.to(self.device)
        return self
