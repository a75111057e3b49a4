"""EngineRules: the questions planning asks the engine a plan is for.

The base lives here, on the sizing floor, so that `WorkerSizing` can hold one; each engine version's
rules (SGLang 0.5.23's, ...) live above, in `kvcache.engines`, and the configurator hands one in.
"""

from __future__ import annotations

from abc import ABC
from typing import ClassVar

import msgspec

from kvcache.inputs.server_args import HybridSwaMemory
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.planning import PlanRequest, plan_pool_sizes
from kvcache.sizing.pool_config import MemoryPoolConfig


class WindowPools(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a model's sliding-window layers get pools of their own, and why (the report may say it)."""

    separate: bool
    why: str


class EngineRules(ABC):
    """One engine version's rules. Subclasses set `name` (the --engine value), `title` and `version`."""

    name: ClassVar[str]
    title: ClassVar[str]
    version: ClassVar[str]

    @property
    def label(self) -> str:
        """'SGLang 0.5.23': what the report names."""
        return f"{self.title} {self.version}"

    def window_pools(self, model: ModelConfig, switch: HybridSwaMemory) -> WindowPools:
        """Sliding-window layers in pools of their own unless --disable-hybrid-swa-memory says otherwise."""
        if switch == "disable":
            return WindowPools(separate=False, why="--disable-hybrid-swa-memory")
        return WindowPools(separate=True, why=f"{self.label} sizes sliding-window layers apart")

    def plan(self, request: PlanRequest) -> MemoryPoolConfig:
        """The pools for a budget: the project's planner unless an engine sizes them its own way."""
        return plan_pool_sizes(request)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label})"
