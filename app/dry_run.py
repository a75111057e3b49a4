"""`plan`'s start-up without a device: the engine's bootstrap order (app.engine.Engine) on a simulated card.

Each worker is wired as EngineContainer wires it (app.plan_wiring); its weights are counted, refused as
ModelRunner.load_weights refuses them (app.worker_refusals) and debited from the card's FixedMemoryProbe; the
target plans as the ranks agree (kvcache.sizing.agreed_plan, what the configurator calls) and the draft shares
its plan. What a bootstrap then carves is the plan's tensor list, in one arena whose size the plan states
(MemoryPoolConfig.arena_bytes), so a dry run allocates nothing and never imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.plan_wiring import WiredWorker, planned_workers
from app.worker_refusals import KV_CACHE_REFUSALS, WorkerRefusals
from kvcache.errors import KVCacheError
from kvcache.inputs.cards import SimulatedCard
from kvcache.inputs.dtypes import DType, KVCacheDtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.agreed_plan import check_draft_shares, plan_as_the_ranks_agree
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.worker_memory import WorkerMemory
from kvcache.sizing.worker_sizing import WorkerSizing


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    """The device a dry run plans for, by kind ("meta": a simulated card, nothing allocated)."""

    type: str

    def __str__(self) -> str:
        return self.type


@dataclass(frozen=True, slots=True)
class PlannedWeights:
    """A worker's weights as the loader would allocate them: its one arena's bytes, and the parameters in it."""

    total_bytes: int
    parameter_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedCache:
    """A worker's KV cache as the configurator would build it (KVCacheConfigResult's numbers, no pools)."""

    memory_pool_config: MemoryPoolConfig
    model_dtype: DType
    kv_cache_dtype: KVCacheDtype
    own_max_total_num_tokens: int  # this rank's own plan, before the ranks agreed
    own_memory: WorkerMemory  # this rank's own readings around its weights
    allocated_bytes: int  # the arena the plan's tensor list is carved from (a draft's: its own pools')


@dataclass(slots=True, kw_only=True)
class PlannedWorker:
    """A target or draft worker started on a simulated card: ModelRunner's start-up phases without tensors."""

    wired: WiredWorker
    parallel_state: ParallelState
    memory_probe: FixedMemoryProbe
    device: PlannedDevice = PlannedDevice("meta")
    timings: dict[str, float] = field(default_factory=dict)
    pre_model_load_memory: int | None = None
    weights: PlannedWeights | None = None
    measured_sizing: None = None  # a dry run measures nothing (the report predicts it: app.report)
    loaded_before: PlannedWorker | None = None  # a draft's: its target (whose refusals a draft's fix must satisfy)
    then_draft: PlannedWorker | None = None  # a target's: its draft (whose weights and pools a target's fix holds)
    _kv_cache: PlannedCache | None = None

    @property
    def role(self) -> str:
        return self.wired.role

    @property
    def model_config(self) -> ModelConfig:
        return self.wired.model_config

    @property
    def sizing(self) -> WorkerSizing:
        return self.wired.sizing

    def configurator_sizing(self) -> WorkerSizing:
        return self.wired.sizing

    @property
    def kv_cache(self) -> PlannedCache:
        if self._kv_cache is None:
            raise KVCacheError(f"the {self.role} worker's KV cache is not planned yet: call init_memory_pool() first")
        return self._kv_cache

    @property
    def memory_pool_config(self) -> MemoryPoolConfig:
        return self.kv_cache.memory_pool_config

    def load_weights(self) -> PlannedWeights:
        """Read the free memory, refuse weights that do not fit it, debit the card by them."""
        start = time.perf_counter()
        self.pre_model_load_memory = self.memory_probe.free_bytes()
        self.timings["profile_before_load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        self.refusals().check_weights_fit(self.wired.weights_bytes)
        self.weights = PlannedWeights(total_bytes=self.wired.weights_bytes, parameter_count=self.wired.parameter_count)
        self.memory_probe.note_allocation(self.weights.total_bytes)
        self.timings["load_weights_s"] = time.perf_counter() - start
        return self.weights

    def init_memory_pool(self, shared: PlannedCache | None = None) -> PlannedCache:
        """The target plans as the ranks agree, refused with a larger --tp-size that plans where one does; a draft
        (given its target's `shared` cache) checks it can share that plan. The card is debited by the arena."""
        if self.pre_model_load_memory is None:
            raise KVCacheError(f"{self.role} worker: load_weights() must run before init_memory_pool()")
        start = time.perf_counter()
        layout = self.sizing.layout()
        if shared is None:
            probe = self.memory_probe
            own = WorkerMemory(total_bytes=probe.total_bytes(), free_before_load=self.pre_model_load_memory,
                               free_after_load=probe.free_bytes(), reported_total_bytes=probe.device_capacity_bytes())
            try:
                agreed = plan_as_the_ranks_agree(self.sizing, own, self.parallel_state.agreement)
            except KV_CACHE_REFUSALS as exc:
                raise self.refusals().with_tp_advice(exc) from None
            plan, own_tokens, own_memory = agreed.plan, agreed.own_tokens, agreed.own_memory
        else:
            plan = shared.memory_pool_config
            check_draft_shares(plan, layout)
            own_tokens, own_memory = plan.max_total_num_tokens, WorkerMemory.of_budget(plan.budget)
        arena = plan.arena_bytes(draft=shared is not None)
        self.memory_probe.note_allocation(arena)
        self._kv_cache = PlannedCache(
            memory_pool_config=plan, model_dtype=self.sizing.model_dtype, kv_cache_dtype=self.sizing.kv_cache_dtype,
            own_max_total_num_tokens=own_tokens, own_memory=own_memory, allocated_bytes=arena)
        self.timings["configure_kv_cache_s"] = time.perf_counter() - start
        return self._kv_cache

    def refusals(self, *, alone: bool = False) -> WorkerRefusals:
        """Why this worker cannot start, with what would work (app.worker_refusals), from its readings now; linked
        to its partner's (a draft's target, a target's draft) unless `alone`."""
        probe = self.memory_probe
        return WorkerRefusals(
            role=self.role, model_config=self.model_config, sizing=self.sizing, device=str(self.device),
            device_type=self.device.type, free_before_load=self.pre_model_load_memory or 0,
            total_bytes=probe.total_bytes(), device_capacity_bytes=probe.device_capacity_bytes(),
            weights_for=self.wired.weights_for,
            loaded_before=None if alone or self.loaded_before is None else self.loaded_before.refusals(alone=True),
            then_draft=None if alone or self.then_draft is None else self.then_draft.refusals(alone=True))


@dataclass(frozen=True, slots=True)
class DryRun:
    """A dry run's target worker and, with speculative decoding, its draft."""

    target: PlannedWorker
    draft: PlannedWorker | None = None

    @property
    def workers(self) -> tuple[PlannedWorker, ...]:
        return (self.target,) if self.draft is None else (self.target, self.draft)

    def bootstrap(self) -> None:
        """Engine.bootstrap's order: both workers' weights (every rank, or none), the target's plan, the draft's."""
        self.target.parallel_state.agreement.run_everywhere(lambda: [w.load_weights() for w in self.workers])
        shared = self.target.init_memory_pool()
        if self.draft is not None:
            self.draft.init_memory_pool(shared)


def dry_run(server_args: ServerArgs, model: ModelConfig, card: SimulatedCard, parallel_state: ParallelState) -> DryRun:
    """The engine's start-up for `card` on the rank of `parallel_state`, planned and not built."""
    probe = FixedMemoryProbe.of_card(card)
    workers = [PlannedWorker(wired=w, parallel_state=parallel_state, memory_probe=probe)
               for w in planned_workers(server_args, model, parallel_state).workers]
    if len(workers) == 2:
        workers[1].loaded_before, workers[0].then_draft = workers[0], workers[1]
    run = DryRun(*workers)
    run.bootstrap()
    return run
