"""The measured bootstrap's floor: SGLang's static plan as the pools built for the post-capture fraction hold it.

The pools are built for the higher fraction, then shrunk to this plan while the worst-case steps are
measured, and the measured plan never keeps fewer tokens unless the step would run out of memory. The
request table is not resized, so the floor keeps SGLang's static tokens in the built pools, its budget grown
by the table rows built beyond SGLang's (resized_plan.built_rows_plan), agreed by the ranks. The bootstrap
and a dry run's prediction both take it from here.
"""

from __future__ import annotations

import dataclasses

from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.resized_plan import built_rows_plan
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory


def static_floor(sizing: WorkerSizing, built: MemoryPoolConfig, ranks: RankAgreement) -> MemoryPoolConfig:
    """SGLang's static plan (its fraction, no resize) for the memory `built` was planned with, held by the built
    pools and request table, at most `built`'s tokens; the same token count on every rank of `ranks`."""
    static_sizing = dataclasses.replace(sizing, settings=sizing.settings.replace(
        kv_headroom="fraction", enable_post_capture_kv_resize=False))
    memory = WorkerMemory.of_budget(built.budget)
    sglang = ranks.run_everywhere(lambda: static_sizing.plan(memory))
    (tokens,) = ranks.min_int64((min(sglang.max_total_num_tokens, built.max_total_num_tokens),))
    held = ranks.run_everywhere(lambda: built_rows_plan(built, sglang, tokens))
    (tokens,) = ranks.min_int64((held.max_total_num_tokens,))
    return ranks.run_everywhere(lambda: built_rows_plan(built, sglang, tokens))
