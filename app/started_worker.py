"""What the report reads of an engine that started: each worker's plan, formats, weights and readings.

A bootstrap's Engine of ModelRunners and `plan`'s dry run (app.dry_run: nothing built, no torch) both are one,
so app.report and app.rank_report report either alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvcache.inputs.dtypes import DType, KVCacheDtype
    from kvcache.inputs.parallel import ParallelState
    from kvcache.memory.memory_probe import MemoryProbe
    from kvcache.models.model_config import ModelConfig
    from kvcache.runtime.measured_headroom import MeasuredSizing
    from kvcache.sizing.pool_config import MemoryPoolConfig
    from kvcache.sizing.worker_memory import WorkerMemory
    from kvcache.sizing.worker_sizing import WorkerSizing


class ConfiguredCache(Protocol):
    """A worker's KV cache as configured (kvcache.configurator.KVCacheConfigResult's numbers)."""

    @property
    def memory_pool_config(self) -> MemoryPoolConfig: ...
    @property
    def model_dtype(self) -> DType: ...
    @property
    def kv_cache_dtype(self) -> KVCacheDtype: ...
    @property
    def own_max_total_num_tokens(self) -> int: ...
    @property
    def own_memory(self) -> WorkerMemory: ...
    @property
    def allocated_bytes(self) -> int: ...


class LoadedWeightBytes(Protocol):
    """A worker's weights: the bytes they take on the device and the parameters they hold."""

    @property
    def total_bytes(self) -> int: ...
    @property
    def parameter_count(self) -> int: ...


class StartedWorker(Protocol):
    """A target or draft worker after start-up (app.model_runner.ModelRunner, app.dry_run.PlannedWorker)."""

    role: str
    model_config: ModelConfig
    parallel_state: ParallelState
    device: Any  # str() names it ("cuda:0", "meta"); .type is its kind
    memory_probe: MemoryProbe
    timings: dict[str, float]
    pre_model_load_memory: int | None
    measured_sizing: MeasuredSizing | None

    @property
    def weights(self) -> LoadedWeightBytes | None: ...
    @property
    def kv_cache(self) -> ConfiguredCache: ...
    @property
    def memory_pool_config(self) -> MemoryPoolConfig: ...
    @property
    def sizing(self) -> WorkerSizing: ...
    def configurator_sizing(self) -> WorkerSizing: ...


class StartedEngine(Protocol):
    """The target worker and, with speculative decoding, the draft (app.engine.Engine, app.dry_run.DryRun)."""

    @property
    def target(self) -> StartedWorker: ...
    @property
    def draft(self) -> StartedWorker | None: ...
    @property
    def workers(self) -> tuple[StartedWorker, ...]: ...
