"""Why a worker cannot start, in one line with what would work: weights that do not fit the free memory, a KV cache
that cannot plan with what the weights leave, and the larger --tp-size that would (checked by planning at it).

Plain numbers in (the probe's readings, the worker's sizing, its weight bytes per rank), typed errors out: nothing
here touches a device, so a dry run and a real start refuse alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from kvcache.byte_units import format_bytes
from kvcache.errors import (
    BudgetBelowOnePageError, BudgetBelowOneRequestError, DoesNotFitError, WeightsDoNotFitError, WeightsLeaveNoRoomError,
)
from kvcache.inputs.cards import CUDA_KERNEL_LOAD_BYTES
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.host_memory import host_memory_bytes
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.memory_size_advice import card_fixes, memory_limit_fixes
from kvcache.sizing.tp_advice import TensorParallelFit, tp_size_that_fits
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory

# A KV cache that cannot plan with what the weights leave: a larger --tp-size may plan (tp_size_suggestion)
KV_CACHE_REFUSALS = (WeightsLeaveNoRoomError, BudgetBelowOnePageError, BudgetBelowOneRequestError)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRefusals:
    """One worker's refusals: its role, model and sizing, the device it runs on, the probe's readings before its
    weights loaded, and its weight bytes on a rank of any layout (`weights_for`, for the --tp-size search)."""

    role: str
    model_config: ModelConfig
    sizing: WorkerSizing
    device: str  # as the line names it: "cuda:0", "cpu" (a dry run's meta device is "the card")
    device_type: str
    free_before_load: int
    total_bytes: int
    device_capacity_bytes: int
    weights_for: Callable[[ParallelState], int]
    loaded_before: WorkerRefusals | None = None  # a draft's: its target's, whose weights load first and whose plan
    # holds the draft's pools, so what would hold the draft is what holds both (the engine's whole start)
    then_draft: WorkerRefusals | None = None  # a target's: its draft's, whose weights load with it and whose pools
    # its plan holds (a larger --tp-size splits them too), so a fix for the target holds both

    def check_weights_fit(self, needed: int) -> None:
        """Refuse `needed` bytes of weights where less than that is free before loading (the probe's reading)."""
        if needed > self.free_before_load:
            raise self.weights_do_not_fit(needed)

    def weights_do_not_fit(self, needed: int, *, refused: bool = False) -> WeightsDoNotFitError:
        """More weights than free memory; or (`refused`) the device refused their allocation although the probe
        saw room for them (another process took it, or fragmentation): then no smaller limit is suggested."""
        free = self.free_before_load
        engine, weights = self._whole_start(needed)
        found = engine._larger_tp_size()
        per_rank = engine._tp_size_line(found, kv_cache_plans_only=False)
        tp_plans = bool(engine._tp_size_line(found, kv_cache_plans_only=True))
        where = 'the card' if self.device_type == 'meta' else self.device
        if refused and needed <= free:
            return WeightsDoNotFitError(
                f"{self.model_config.name}'s {self.role} weights ({format_bytes(needed)} on this rank) could not be "
                f"allocated on {where} although {format_bytes(free)} were free before loading (another process may "
                "hold memory there); what was allocated is freed", needed_bytes=needed, available_bytes=free,
                suggestions=per_rank)
        return WeightsDoNotFitError(
            f"{self.model_config.name}'s {self.role} weights ({format_bytes(needed)} on this rank) do not fit "
            f"in the {format_bytes(free)} free on {where}",
            needed_bytes=needed, available_bytes=free,
            suggestions=(*per_rank, *card_fixes(engine.sizing, weights_bytes=weights,
                                                dry_run=self.device_type == "meta", only_found=tp_plans))
            if self.device_type != "cpu" else
            memory_limit_fixes(engine.sizing, used_bytes=engine.total_bytes - engine.free_before_load,
                               weights_bytes=weights, host_memory=host_memory_bytes()),
        )

    def _whole_start(self, needed: int) -> tuple[WorkerRefusals, int]:
        """The refusals a fix must satisfy (the target's, linked to its draft: from the readings before the target
        loaded) and the weights it must hold on this rank (this worker's `needed` and its partner's)."""
        target = self.loaded_before or self
        draft = self if self.loaded_before is not None else self.then_draft
        if draft is None:
            return self, needed
        partner = target if target is not self else draft
        weights = partner.weights_for(self.sizing.parallel_state) + needed
        return replace(target, loaded_before=None, then_draft=draft), weights

    def refuse_a_kv_cache_that_cannot_plan(self, weights: int) -> None:
        """Before filling the weights (a CPU fills 15 GiB of dummy weights in ~26 s): plan with the most memory they
        could leave free; a KV cache that does not plan with that does not plan after loading either."""
        free = self.free_before_load
        best = WorkerMemory(total_bytes=self.total_bytes, free_before_load=free, free_after_load=free - weights,
                            reported_total_bytes=self.device_capacity_bytes)
        try:
            self.sizing.plan(best)
        except KV_CACHE_REFUSALS as exc:
            raise self.with_tp_advice(exc) from None

    def with_tp_advice(self, exc: DoesNotFitError) -> DoesNotFitError:
        """A KV cache's refusal (one of KV_CACHE_REFUSALS) naming first the larger --tp-size that plans, if any."""
        return exc.with_suggestions(self.tp_size_suggestion(kv_cache_plans_only=True) + exc.suggestions)

    def tp_size_suggestion(self, *, kv_cache_plans_only: bool) -> tuple[str, ...]:
        """A larger --tp-size, checked by planning at it with the defaults' reserve (kvcache.sizing.tp_advice), on a
        card (a CPU engine has no TP to offer); none when only the weights would fit and `kv_cache_plans_only`."""
        engine, _ = self._whole_start(0)
        return engine._tp_size_line(engine._larger_tp_size(), kv_cache_plans_only=kv_cache_plans_only)

    def _larger_tp_size(self) -> TensorParallelFit | None:
        """The least larger --tp-size whose weights fit (its KV cache checked where the engine plans pools here)."""
        if self.device_type == "cpu":
            return None
        draft = self.then_draft
        return tp_size_that_fits(  # a card's context grows by its kernels as the weights are filled
            self.sizing, free_before_load=self.free_before_load, total_bytes=self.total_bytes,
            device_capacity_bytes=self.device_capacity_bytes, context_growth=CUDA_KERNEL_LOAD_BYTES,
            weights_for=self.weights_for if draft is None else lambda s: self.weights_for(s) + draft.weights_for(s),
            check_kv_cache=self.role == "target" and self.sizing.engine.plans_pools,
            draft=None if draft is None else draft.sizing)

    def _tp_size_line(self, found: TensorParallelFit | None, *, kv_cache_plans_only: bool) -> tuple[str, ...]:
        """The --tp-size suggestion for `found`; none when only its weights fit and `kv_cache_plans_only`."""
        if found is None or (kv_cache_plans_only and self.role != "target"):
            return ()
        engine_plans = self.sizing.engine.plans_pools  # vLLM's blocks are its own: its TP is checked for weights alone
        weights_alone = not (found.kv_cache_plans and engine_plans)
        if kv_cache_plans_only and weights_alone:
            return ()
        return (f"--tp-size {found.tp_size} (about {format_bytes(found.weights_bytes)} per rank"
                f"{', for the weights alone: the KV cache then needs more' if weights_alone else ''}"
                + (f", each request capped at {found.request_token_cap:,} tokens" if found.request_token_cap else "") + ")",)
