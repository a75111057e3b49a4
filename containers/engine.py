"""EngineContainer: the root. It alone knows every collaborator and wires the workers."""

from __future__ import annotations

from dependency_injector import containers, providers

from app.engine import Engine, draft_runner_for
from app.parallel_setup import parallel_state_resource
from kvcache.configurator import SharedTargetCache
from kvcache.engines import engine_rules
from kvcache.memory.devices import resolve_device
from kvcache.models.draft_pairing import draft_model_for
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.memory.memory_probe import probe_for_device
from kvcache.models.model_config import ModelConfig
from kvcache.models.model_page_size import forced_page_size, note_on_page_size
from kvcache.sizing.pool_layout import draft_cache_layout
from kvcache.sizing.pool_config import DRAFT_POOL_PREFIX
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.speculative_defaults import with_speculative_defaults

from containers.worker import WorkerContainer


class EngineContainer(containers.DeclarativeContainer):
    """Give it `server_args` and `model_config`; ask it for `engine` (or any part)."""

    server_args = providers.Dependency(instance_of=ServerArgs)
    model_config = providers.Dependency(instance_of=ModelConfig)
    card = providers.Object(None)  # a SimulatedCard for dry-run plans on the meta device

    # What the workers size with: the draft shape filled in from the target, as SGLang's launcher does,
    # and the page size the target forces, if any (a DSA model pages at 64; the draft shares the target's pages).
    worker_server_args = providers.Callable(with_speculative_defaults, server_args, model_config.provided.architecture)
    model_page_size = providers.Callable(forced_page_size, model_config)
    page_size_note = providers.Callable(note_on_page_size, server_args.provided.page_size, model_config)
    parallel_state = providers.Resource(parallel_state_resource, server_args)
    device = providers.ThreadSafeSingleton(resolve_device, server_args.provided.device, parallel_state.provided.local_rank)
    memory_probe = providers.ThreadSafeSingleton(
        probe_for_device, device, memory_limit=server_args.provided.memory_limit, card=card,
    )
    model_dtype = providers.Callable(resolve_model_dtype, server_args.provided.dtype, model_config.provided.checkpoint_dtype)
    kv_cache_dtype = providers.Callable(resolve_kv_cache_dtype, server_args.provided.kv_cache_dtype, model_dtype)
    engine_rules = providers.Callable(engine_rules, server_args.provided.engine)  # --engine's rules (kvcache.engines)
    # The target as the engine builds it (SGLang loads no vision tower for text-only Qwen3-VL/3.5, or Llama-4
    # without --enable-multimodal)
    served_model_config = engine_rules.provided.served_model.call(
        model_config, enable_multimodal=server_args.provided.enable_multimodal,
        language_model_only=server_args.provided.language_model_only)

    # The one place the speculative algorithm is read: no draft, the target's own MTP layer, or a checkpoint.
    draft_model_config = providers.Callable(  # checked against the target (kvcache.models.draft_pairing)
        draft_model_for, server_args.provided.speculative_algorithm, server_args.provided.speculative_draft_model,
        model_config)
    # The draft's pools as the target pays for them (None without a draft; declared here because
    # target and draft refer to each other).
    draft_layout = providers.Callable(
        draft_cache_layout, draft_model_config,
        parallel_state=parallel_state, kv_cache_dtype=kv_cache_dtype, model_dtype=model_dtype,
        mamba_ssm_dtype=server_args.provided.mamba_ssm_dtype, engine=engine_rules,
        hybrid_swa_memory=server_args.provided.hybrid_swa_memory,
    )

    target = providers.Container(
        WorkerContainer,
        role=providers.Object("target"),
        server_args=worker_server_args, model_config=served_model_config, parallel_state=parallel_state,
        device=device, memory_probe=memory_probe, model_dtype=model_dtype, kv_cache_dtype=kv_cache_dtype,
        engine_rules=engine_rules, draft_layout=draft_layout, forced_page_size=model_page_size,
    )
    draft = providers.Container(
        WorkerContainer,
        role=providers.Object("draft"),
        server_args=worker_server_args, model_config=draft_model_config, parallel_state=parallel_state,
        device=device, memory_probe=memory_probe, model_dtype=model_dtype, kv_cache_dtype=kv_cache_dtype,
        engine_rules=engine_rules, pool_name_prefix=providers.Object(DRAFT_POOL_PREFIX),
        forced_page_size=model_page_size, is_draft_worker=providers.Object(True),
        loaded_before=target.model_runner.provided.refusals.call(),
        shared=providers.Factory(
            SharedTargetCache,
            req_to_token_pool=target.model_runner.provided.req_to_token_pool,
            token_to_kv_pool_allocator=target.model_runner.provided.token_to_kv_pool_allocator,
            memory_pool_config=target.model_runner.provided.memory_pool_config,
        ),
    )

    draft_runner = providers.Callable(draft_runner_for, draft_model_config, draft.model_runner.provider)
    engine = providers.ThreadSafeSingleton(Engine, target=target.model_runner, draft=draft_runner)
