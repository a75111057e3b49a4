"""A dry run's workers without a device: what EngineContainer wires for them, from the same functions.

`plan` (app.dry_run) starts each worker from it, and `fit` plans a hundred cells and needs, per (TP, PP, KV dtype),
the target's WorkerSizing and each worker's weight bytes; nothing there touches a tensor, so it is wired here
without torch (the container's workers build their runners, which import it). tests/test_fast_answers.py checks
that this wiring and the container's agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.weights.shapes import parameter_count, rank_parameter_specs
from app.weights.storage import bytes_needed
from kvcache.engines import engine_rules
from kvcache.inputs.dtypes import DType, resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.inputs.speculative_defaults import with_speculative_defaults
from kvcache.models.draft_pairing import draft_model_for
from kvcache.models.model_config import ModelConfig
from kvcache.models.model_page_size import forced_page_size
from kvcache.sizing.pool_layout import DRAFT_POOL_PREFIX, draft_cache_layout
from kvcache.sizing.worker_sizing import WorkerSizing


def single_process_state(a: ServerArgs) -> ParallelState:
    """Rank 0 of the --tp-size x --pp-size layout, planned by one process alone (a dry run, or no torchrun)."""
    return ParallelState(tp_size=a.tp_size, pp_size=a.pp_size, pp_layer_partition=a.pp_layer_partition,
                         attention_dp_size=a.attention_dp_size, min_rank_memory_ratio=a.min_rank_memory_ratio)


@dataclass(frozen=True, slots=True)
class WiredWorker:
    """One worker as its WorkerContainer wires it: role, model, sizing, and its weights on this rank (bytes and
    parameters) or on a rank of any layout (`weights_for`, for the --tp-size search)."""

    role: str  # "target" or "draft"
    model_config: ModelConfig  # the target as the engine serves it, or the draft
    sizing: WorkerSizing
    weights_bytes: int
    parameter_count: int
    model_dtype: DType

    def weights_for(self, parallel_state: ParallelState) -> int:
        """The bytes ModelRunner.load_weights checks on a rank of `parallel_state`."""
        return weight_bytes(self.model_config, parallel_state, self.model_dtype)


@dataclass(frozen=True, slots=True)
class PlannedWorkers:
    """The target worker, then the draft's where there is one."""

    workers: tuple[WiredWorker, ...]

    @property
    def sizing(self) -> WorkerSizing:
        """The target's sizing on a device of the wiring's type."""
        return self.workers[0].sizing

    @property
    def weights(self) -> tuple[int, ...]:
        """Each worker's weight bytes on this rank (target, then draft)."""
        return tuple(w.weights_bytes for w in self.workers)


def weight_bytes(model: ModelConfig, parallel_state: ParallelState, model_dtype: DType) -> int:
    """What ModelRunner.load_weights allocates for `model` on a rank of `parallel_state` (its one arena)."""
    return bytes_needed(rank_parameter_specs(model, parallel_state), model_dtype, model.weights.quantization)


def planned_workers(server_args: ServerArgs, model: ModelConfig, parallel_state: ParallelState,
                    device_type: str = "meta") -> PlannedWorkers:
    """Each worker's WorkerSizing as EngineContainer wires it (its speculative defaults, served model, page size,
    the target paying for the draft's pools, the draft sharing the target's plan) and its weights on this rank."""
    rules = engine_rules(server_args.engine)
    served = rules.served_model(model, enable_multimodal=server_args.enable_multimodal,
                                language_model_only=server_args.language_model_only)
    draft = draft_model_for(server_args.speculative_algorithm, server_args.speculative_draft_model, model)
    model_dtype = resolve_model_dtype(server_args.dtype, model.checkpoint_dtype)
    kv_dtype = resolve_kv_cache_dtype(server_args.kv_cache_dtype, model_dtype)
    draft_layout = draft_cache_layout(
        draft, parallel_state=parallel_state, kv_cache_dtype=kv_dtype, model_dtype=model_dtype,
        mamba_ssm_dtype=server_args.mamba_ssm_dtype, engine=rules, hybrid_swa_memory=server_args.hybrid_swa_memory)
    settings = SizingSettings.from_server_args(with_speculative_defaults(server_args, model.architecture),
                                               forced_page_size=forced_page_size(model))

    def wired(role: str, m: ModelConfig, **sizing: Any) -> WiredWorker:
        specs = rank_parameter_specs(m, parallel_state)
        return WiredWorker(
            role=role, model_config=m, model_dtype=model_dtype, parameter_count=parameter_count(specs),
            weights_bytes=bytes_needed(specs, model_dtype, m.weights.quantization),
            sizing=WorkerSizing(settings=settings, model_config=m, parallel_state=parallel_state,
                                model_dtype=model_dtype, kv_cache_dtype=kv_dtype, device_type=device_type, engine=rules,
                                layer_ids=parallel_state.layer_range(m.num_hidden_layers), **sizing))

    target = wired("target", served, draft_layout=draft_layout)
    if draft is None:
        return PlannedWorkers((target,))
    return PlannedWorkers((target, wired("draft", draft, pool_name_prefix=DRAFT_POOL_PREFIX, is_draft_worker=True)))
