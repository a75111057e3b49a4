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
from kvcache.sizing.planning import PlanRequest
from kvcache.sizing.pool_config import MemoryPoolConfig


class VllmRules(EngineRules):
    """vLLM 0.34.0."""

    name = "vllm"
    title = "vLLM"
    version = VLLM_VERSION
    plans_pools = False  # its answer is vLLM's block count (kvcache.engines.vllm_plan)

    def config_notes(self, model: ModelConfig) -> tuple[str, ...]:
        """An architecture vLLM 0.34.0 has no model class for (kvcache.engines.model_classes)."""
        note = no_model_class_note(model.hf_config, engine=self.name, version=self.version, label=self.label)
        return () if note is None else (note,)

    def plan(self, request: PlanRequest) -> MemoryPoolConfig:
        raise ConfigError("--engine vllm plans vLLM's own blocks, not this engine's pools: use "
                          "`plan --engine vllm --gpu NAME` (a dry run)")


VLLM = VllmRules()
