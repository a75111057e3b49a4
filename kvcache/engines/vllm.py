"""vLLM 0.34.0's rules as an --engine choice: its answer is its own block plan (kvcache.engines.vllm_answer).

vLLM shares one block pool among KV cache groups whose layers alias one tensor; the project's pools are
SGLang-shaped, so `--engine vllm` is a dry run (`plan`) that reports vLLM's blocks and concurrency and
builds no pools: asked for pools, these rules refuse.
"""

from __future__ import annotations

from kvcache.engines.model_classes import no_model_class_note
from kvcache.engines.vllm_rules import VLLM_VERSION
from kvcache.errors import ConfigError
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.engine_rules import EngineRules
from kvcache.sizing.plan_request import PlanRequest, StartupMinimums
from kvcache.sizing.pool_config import MemoryPoolConfig


class VllmRules(EngineRules):
    """vLLM 0.34.0."""

    name = "vllm"
    title = "vLLM"
    version = VLLM_VERSION
    plans_pools = False  # its answer is vLLM's block count (kvcache.engines.vllm_plan)
    # vLLM 0.34.0's start-up minimums: config/model.py refuses a max_model_len below 1 (the flag's own bound);
    # the others are its rules in kvcache.engines.vllm_rules, each citing its file: check_block_size
    # (attention/backends/flash_attn.py), scheduler_limits (config/scheduler.py), max_model_len (config/model.py),
    # and plan_vllm's null block plus one request (v1/core/kv_cache_planning.py, its memory check)
    minimums = StartupMinimums(context_length=1, pool_tokens=1)

    def config_notes(self, model: ModelConfig) -> tuple[str, ...]:
        """An architecture vLLM 0.34.0 has no model class for (kvcache.engines.model_classes)."""
        note = no_model_class_note(model.hf_config, engine=self.name, version=self.version, label=self.label)
        return () if note is None else (note,)

    def plan(self, request: PlanRequest) -> MemoryPoolConfig:
        raise ConfigError("--engine vllm plans vLLM's own blocks, not this engine's pools: use "
                          "`plan --engine vllm --gpu NAME` (a dry run)")


VLLM = VllmRules()
