"""A dry run's target worker without a device: what EngineContainer wires for it, from the same functions.

`fit` plans a hundred cells and needs, per (TP, PP, KV dtype), the target's WorkerSizing and each worker's
weight bytes; nothing there touches a tensor, so it is wired here without torch (the container's workers
build their runners, which import it). tests/test_fit.py checks that this wiring and the container's agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.weights.shapes import rank_parameter_specs
from app.weights.storage import bytes_needed
from kvcache.engines import engine_rules
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.inputs.speculative_defaults import with_speculative_defaults
from kvcache.models.draft_pairing import draft_model_for
from kvcache.models.model_config import ModelConfig
from kvcache.models.model_page_size import forced_page_size
from kvcache.sizing.pool_layout import draft_cache_layout
from kvcache.sizing.worker_sizing import WorkerSizing


def single_process_state(a: ServerArgs) -> ParallelState:
    """Rank 0 of the --tp-size x --pp-size layout, planned by one process alone (a dry run, or no torchrun)."""
    return ParallelState(tp_size=a.tp_size, pp_size=a.pp_size, pp_layer_partition=a.pp_layer_partition,
                         attention_dp_size=a.attention_dp_size, min_rank_memory_ratio=a.min_rank_memory_ratio)


@dataclass(frozen=True, slots=True)
class PlannedWorkers:
    """The target's sizing on a device of `device_type`, and the weight bytes of each worker (target, then draft)."""

    sizing: WorkerSizing
    weights: tuple[int, ...]


def planned_workers(server_args: ServerArgs, model: ModelConfig, parallel_state: ParallelState,
                    device_type: str = "meta") -> PlannedWorkers:
    """The target worker's WorkerSizing as EngineContainer wires it (its speculative defaults, served model, page
    size, draft pools) and the bytes ModelRunner.load_weights checks for each worker."""
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
    sizing = WorkerSizing(settings=settings, model_config=served, parallel_state=parallel_state,
                          model_dtype=model_dtype, kv_cache_dtype=kv_dtype, device_type=device_type, engine=rules,
                          layer_ids=parallel_state.layer_range(served.num_hidden_layers), draft_layout=draft_layout)
    weights = tuple(bytes_needed(rank_parameter_specs(m, parallel_state), model_dtype, m.weights.quantization)
                    for m in (served, draft) if m is not None)
    return PlannedWorkers(sizing=sizing, weights=weights)
