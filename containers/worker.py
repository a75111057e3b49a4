"""WorkerContainer: one worker (target or draft). The engine container gives it its collaborators."""

from __future__ import annotations

import torch
from dependency_injector import containers, providers

from app.model_runner import ModelRunner
from kvcache.configurator import KVCacheConfigurator
from kvcache.dtypes import resolve_kv_cache_dtype
from kvcache.model_config import ModelConfig
from kvcache.parallel import ParallelState
from kvcache.pool_layout import worker_cache_layout
from kvcache.server_args import ServerArgs
from kvcache.streams import forward_stream_for


class WorkerContainer(containers.DeclarativeContainer):
    """A target and a draft are two instances of this class, wired differently."""

    role = providers.Object("target")
    server_args = providers.Dependency(instance_of=ServerArgs)
    model_config = providers.Dependency(instance_of=ModelConfig)
    parallel_state = providers.Dependency(instance_of=ParallelState)
    device = providers.Dependency(instance_of=torch.device)
    memory_probe = providers.Dependency()
    model_dtype = providers.Dependency(instance_of=torch.dtype)
    pool_name_prefix = providers.Object("")
    draft_layout = providers.Object(None)  # a target with a draft pays for the draft's pools
    shared = providers.Object(None)  # a draft gets the target's request table, allocator and plan

    kv_cache_dtype = providers.Callable(resolve_kv_cache_dtype, server_args.provided.kv_cache_dtype, model_dtype)
    layer_range = providers.Callable(parallel_state.provided.layer_range.call(model_config.provided.num_hidden_layers))
    cache_layout = providers.Callable(
        worker_cache_layout,
        model_config=model_config, parallel_state=parallel_state, kv_cache_dtype=kv_cache_dtype,
        model_dtype=model_dtype, mamba_ssm_dtype=server_args.provided.mamba_ssm_dtype,
        layer_ids=layer_range, prefix=pool_name_prefix,
    )
    forward_stream = providers.ThreadSafeSingleton(forward_stream_for, device)

    configurator = providers.Factory(
        KVCacheConfigurator,
        server_args=server_args, model_config=model_config, parallel_state=parallel_state,
        model_dtype=model_dtype, kv_cache_dtype=kv_cache_dtype, device=device, memory_probe=memory_probe,
        layer_ids=layer_range, pool_name_prefix=pool_name_prefix, draft_layout=draft_layout, shared=shared,
    )
    model_runner = providers.ThreadSafeSingleton(
        ModelRunner,
        role=role, model_config=model_config, parallel_state=parallel_state, device=device,
        model_dtype=model_dtype, memory_probe=memory_probe, configurator_factory=configurator.provider,
        forward_stream=forward_stream,
    )
