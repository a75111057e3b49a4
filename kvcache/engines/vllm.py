"""vLLM 0.34.0's rules as an --engine choice: its answer is its own block plan (kvcache.engines.vllm_answer).

vLLM shares one block pool among KV cache groups whose layers alias one tensor; the project's pools are
SGLang-shaped, so `--engine vllm` is a dry run (`plan`) that reports vLLM's blocks and concurrency and
builds no pools: asked for pools, these rules refuse.
"""

from __future__ import annotations

from kvcache.engines.vllm_rules import VLLM_VERSION
from kvcache.errors import ConfigError
from kvcache.sizing.engine_rules import EngineRules
from kvcache.sizing.planning import PlanRequest
from kvcache.sizing.pool_config import MemoryPoolConfig


class VllmRules(EngineRules):
    """vLLM 0.34.0."""

    name = "vllm"
    title = "vLLM"
    version = VLLM_VERSION
    plans_pools = False  # its answer is vLLM's block count (kvcache.engines.vllm_plan)

    def plan(self, request: PlanRequest) -> MemoryPoolConfig:
        raise ConfigError("--engine vllm plans vLLM's own blocks, not this engine's pools: use "
                          "`plan --engine vllm --gpu NAME` (a dry run)")


VLLM = VllmRules()
