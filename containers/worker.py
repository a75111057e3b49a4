"""WorkerContainer: one worker (target or draft). The engine container gives it its collaborators."""

from __future__ import annotations

import torch
from dependency_injector import containers, providers

from app.forward.worst_case import ReferenceWorstCaseStep
from app.model_runner import ModelRunner
from kvcache.allocators.factory import allocator_for_plan
from kvcache.configurator import KVCacheConfigurator
from kvcache.engines import EngineRules
from kvcache.inputs.dtypes import DType, KVCacheDtype
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.runtime.streams import forward_stream_for


class WorkerContainer(containers.DeclarativeContainer):
    """A target and a draft are two instances of this class, wired differently.

    Override `allocator_factory`, `forward_stream` (or the engine's `memory_probe`) on an
    instance and the configurator and runner use the replacement.
    """

    role = providers.Object("target")
    server_args = providers.Dependency(instance_of=ServerArgs)
    model_config = providers.Dependency(instance_of=ModelConfig)
    parallel_state = providers.Dependency(instance_of=ParallelState)
    device = providers.Dependency(instance_of=torch.device)
    memory_probe = providers.Dependency(instance_of=MemoryProbe)
    model_dtype = providers.Dependency(instance_of=DType)
    kv_cache_dtype = providers.Dependency(instance_of=KVCacheDtype)
    engine_rules = providers.Dependency(instance_of=EngineRules)
    pool_name_prefix = providers.Object("")
    draft_layout = providers.Object(None)  # a target with a draft pays for the draft's pools
    is_draft_worker = providers.Object(False)
    shared = providers.Object(None)  # a draft's: the target's request table, allocator and plan, asked for only
    # when the draft configures (its sizing and refusals are known before the target has built them)
    loaded_before = providers.Object(None)  # a draft's: its target's refusals (a fix for the draft must hold both)
    forced_page_size = providers.Object(None)  # the page size the target model imposes (DSA: 64), if any

    settings = providers.Callable(SizingSettings.from_server_args, server_args, forced_page_size=forced_page_size)
    layer_range = providers.Callable(parallel_state.provided.layer_range.call(model_config.provided.num_hidden_layers))
    forward_stream = providers.ThreadSafeSingleton(forward_stream_for, device)
    allocator_factory = providers.Callable(allocator_for_plan)  # called as (plan=..., device=...)
    # the engine's largest steps, measured for the headroom: called as (runner=, chunked_prefill_size=,
    # decode_batch=, largest_graph_batch=); an engine overrides it with its own forward, tests with a fake
    worst_case_step = providers.Callable(ReferenceWorstCaseStep)

    configurator = providers.Factory(
        KVCacheConfigurator,
        settings=settings, model_config=model_config, parallel_state=parallel_state,
        model_dtype=model_dtype, kv_cache_dtype=kv_cache_dtype, device=device, memory_probe=memory_probe,
        allocator_factory=allocator_factory.provider, forward_stream=forward_stream, engine=engine_rules,
        layer_ids=layer_range, pool_name_prefix=pool_name_prefix, draft_layout=draft_layout,
        is_draft_worker=is_draft_worker,
    )
    model_runner = providers.ThreadSafeSingleton(
        ModelRunner,
        role=role, model_config=model_config, parallel_state=parallel_state, device=device,
        model_dtype=model_dtype, memory_probe=memory_probe, configurator_factory=configurator.provider,
        forward_stream=forward_stream, worst_case_step_factory=worst_case_step.provider,
        target_cache_factory=shared.provider, target_refusals_factory=loaded_before.provider,
    )
