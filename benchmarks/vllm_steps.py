"""vLLM 0.34.0's side of the allocator benchmark: its BlockPool alone, and its whole host path to slot indices.

BlockPool only: get_new_blocks(k) + free_blocks, the block-id bookkeeping, no slot index.

Scheduler path (SchedulerPath): what vLLM's v1 scheduler and CPU model runner call on the
host, per step, to turn "these requests need n more tokens" into one KV slot index per token,
with prefix caching off and one full-attention KV cache group:
  scheduler  kv_cache_manager.new_step_starts(); allocate_slots(request, n) for every scheduled
             request, as schedule() calls it whether or not a block is needed; get_block_ids(
             allow_none=True) of each result (the per-request data sent to the worker);
             take_new_block_ids() (drained every step);
  worker     CPUBlockTables.append_block_ids(row, ids) for each request that got blocks, then
             compute_slot_mappings(idx_mapping, query_start_loc, positions): the slot per token;
  release    block_pool.free_blocks of as many blocks as were taken (what kv_cache_manager.free
             does when a request finishes), so occupancy stays steady.
The time is those calls only (CPU runs; vLLM's GPU runner does the table writes and slot mapping
in Triton kernels instead). Not timed: the harness rolling requests back and advancing their token
counts and positions (the scheduler's own request updates), and the block-table gather.
vLLM's CPU slot mapping is a compiled op missing from the CUDA wheel: reference_allocators
stands in for it with numpy, and slot_mapping_seconds() reports that part alone.

Workloads (the same tokens as ours and SGLang's steps):
  decode  256 running requests, 1 new token each. Request r starts at base + (-r mod ps) tokens
          (base: 8 pages, fewer where the pool is too small for 256 requests, None when it cannot
          hold one page each), so 1/ps of them (rotating) reach a page boundary each step and take a block;
          on its next crossing a request first gives back the block it took ps steps before
          (rewound by ps tokens), so every request cycles through one page. page 1 = this with
          block size 1 (every request takes and gives back one block per step).
  extend  8 requests of 256 new tokens on ours' prefixes (4 pages, every second one half a page
          more); the fresh blocks are given back after each step.
"""

from __future__ import annotations

import time
import timeit
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch

DECODE_REQUESTS = 256
EXTEND_REQUESTS, EXTEND_TOKENS = 8, 256
DECODE_BASE_PAGES = 8


def block_pool_step(pool: Any, count: int) -> Callable[[int], float]:
    """BlockPool only: take `count` blocks and give them back."""
    def step(i: int) -> float:
        t0 = time.perf_counter()
        pool.free_blocks(pool.get_new_blocks(count))
        return time.perf_counter() - t0
    return step


class _Request:
    """The fields of a vLLM Request that the KV cache manager reads (the real class needs the whole engine)."""

    __slots__ = ("request_id", "num_computed_tokens", "num_in_flight_tokens", "num_prompt_tokens", "num_tokens", "status")

    def __init__(self, request_id: str, computed: int, prompt: int, status: Any) -> None:
        self.request_id, self.num_computed_tokens, self.num_in_flight_tokens = request_id, computed, 0
        self.num_prompt_tokens, self.num_tokens, self.status = prompt, max(prompt, computed + 1), status


class SchedulerPath:
    """One vLLM KV cache manager and CPU block table serving one batch, step after step (see the module docstring).

    Request r starts with computed[r] tokens (its prefill allocated outside the timing) and asks for
    new_tokens[r] more each step. `fits` is False when the pool cannot hold the batch's own pages.
    """

    def __init__(self, vllm: SimpleNamespace, pool_tokens: int, ps: int, computed: list[int], new_tokens: list[int],
                 *, hold_half: bool = True) -> None:
        blocks = pool_tokens // ps  # + the null block, as vLLM sizes it
        spec = vllm.FullAttentionSpec(block_size=ps, num_kv_heads=1, head_size=64, dtype=torch.float16)
        config = vllm.KVCacheConfig(num_blocks=blocks + 1, kv_cache_tensors=[],
                                    kv_cache_groups=[vllm.KVCacheGroupSpec(["layer"], spec)])
        self.manager = vllm.KVCacheManager(config, max_model_len=1 << 30, scheduler_block_size=ps,
                                           hash_block_size=ps, enable_caching=False)
        self.ps, self.new_tokens, count = ps, new_tokens, len(computed)
        self.decode, self.base = all(n == 1 for n in new_tokens), min(computed) // ps * ps
        running = vllm.RequestStatus.RUNNING
        self.requests = [_Request(f"r{r}", 0, c + n, running) for r, (c, n) in enumerate(zip(computed, new_tokens))]
        # a decode request's length cycles up to base + ps (one page), an extend request's is fixed
        lengths = [max(c + n, self.base + ps if self.decode else 0) for c, n in zip(computed, new_tokens)]
        self.tables = vllm.CPUBlockTables(block_sizes=[ps], max_num_reqs=count, max_num_batched_tokens=sum(new_tokens),
                                          max_num_blocks_per_group=[-(-max(lengths) // ps)], device=torch.device("cpu"))
        self.fits = sum(-(-length // ps) for length in lengths) <= blocks
        if not self.fits:
            return
        for row, (request, c) in enumerate(zip(self.requests, computed)):  # the prefill, outside the timing
            if c:
                self.tables.append_block_ids(row, self.manager.allocate_slots(request, c).get_block_ids(), overwrite=False)
            request.num_computed_tokens, request.num_tokens = c, c + new_tokens[row]
        if hold_half:  # about half the pool held, as for the other allocators
            self.manager.block_pool.get_new_blocks(max(0, blocks // 2 - self.held_blocks()))
        self.idx_mapping = torch.arange(count, dtype=torch.int32)
        self.query_start_loc = torch.tensor(np.concatenate(([0], np.cumsum(new_tokens))), dtype=torch.int32)
        self.positions_np = np.concatenate([np.arange(c, c + n) for c, n in zip(computed, new_tokens)]).astype(np.int64)
        self.positions = torch.from_numpy(self.positions_np)
        self.stepped = False

    @classmethod
    def for_workload(cls, vllm: SimpleNamespace, pool_tokens: int, ps: int, workload: str) -> SchedulerPath | None:
        """The benchmark's decode (and page 1) or extend batch; None if the pool cannot hold its requests' pages."""
        if workload == "extend":
            computed = [ps * 4 + (ps // 2 if r % 2 else 0) for r in range(EXTEND_REQUESTS)]
            path = cls(vllm, pool_tokens, ps, computed, [EXTEND_TOKENS] * EXTEND_REQUESTS)
        else:
            base = min(DECODE_BASE_PAGES, pool_tokens // ps // DECODE_REQUESTS - 1) * ps
            computed = [max(base, 0) + (-r) % ps for r in range(DECODE_REQUESTS)]
            path = cls(vllm, pool_tokens, ps, computed, [1] * DECODE_REQUESTS)
        return path if path.fits else None

    def blocks_of(self, row: int) -> list[Any]:
        """The blocks vLLM's manager holds for request `row`."""
        return self.manager.coordinator.single_type_managers[0].req_to_blocks[self.requests[row].request_id]

    def held_blocks(self) -> int:
        return sum(len(self.blocks_of(row)) for row in range(len(self.requests)))

    def _give_back(self, row: int, count: int) -> list[Any]:
        """Harness: pop a request's last `count` blocks from the manager and its block-table row."""
        blocks = self.blocks_of(row)
        taken = blocks[len(blocks) - count:]
        del blocks[len(blocks) - count:]
        self.tables.num_blocks_np[0, row] -= count
        return taken

    def slots(self) -> torch.Tensor:
        """The block table's slot mapping for this step's tokens (vLLM's compute_slot_mappings)."""
        return self.tables.compute_slot_mappings(self.idx_mapping, self.query_start_loc, self.positions,
                                                 num_tokens_padded=self.positions.shape[0])[0]

    def allocate(self) -> list[Any]:
        """The timed scheduler + worker calls of one step; returns each request's new KVCacheBlocks."""
        manager = self.manager
        manager.new_step_starts()
        new_blocks = [manager.allocate_slots(request, n) for request, n in zip(self.requests, self.new_tokens)]
        new_ids = [blocks.get_block_ids(allow_none=True) for blocks in new_blocks]
        manager.take_new_block_ids()
        for row, ids in enumerate(new_ids):
            if ids is not None:
                self.tables.append_block_ids(row, ids, overwrite=False)
        self.slots()
        return new_blocks

    def step(self, i: int) -> float:
        """One step; returns the seconds spent in vLLM's calls."""
        clock, ps = time.perf_counter, self.ps
        if not self.decode:
            t0 = clock()
            new_blocks = self.allocate()
            spent = clock() - t0
            fresh = [b for row, blocks in enumerate(new_blocks) for b in self._give_back(row, len(blocks.blocks[0]))]
            t1 = clock()
            self.manager.block_pool.free_blocks(fresh)
            return spent + clock() - t1
        if self.stepped:  # the previous step's tokens are computed now (left until here so slots() repeats a step)
            for request in self.requests:
                request.num_computed_tokens += 1
                request.num_tokens = request.num_computed_tokens + 1
            self.positions_np += 1
        self.stepped, freed = True, []
        for row, request in enumerate(self.requests):  # those about to cross again give back their last block
            if request.num_computed_tokens == self.base + ps:
                freed += self._give_back(row, 1)
                request.num_computed_tokens -= ps
                request.num_tokens -= ps
                self.positions_np[row] -= ps
        t0 = clock()
        self.manager.block_pool.free_blocks(freed)
        self.allocate()
        return clock() - t0

    def slot_mapping_seconds(self) -> float:
        """What the numpy stand-in for vLLM's compiled slot-mapping op costs per step on its own."""
        return min(timeit.repeat(self.slots, number=200, repeat=5)) / 200
