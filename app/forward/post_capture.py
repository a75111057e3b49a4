"""Apply the post-capture resize to a worker's live pools (the decision itself is pure: kvcache.runtime).

Measure what is free after capture, decide the smaller plan (the ranks agree on the decision
and the smallest token count), then resize the pools by kvcache.runtime.live_resize, the one
road every resize takes: a fresh allocator with the same tokens in use (refused if any sit in
the tail), then every per-layer buffer's tail unmapped in the VMM allocations. Addresses do not
move, so captured graphs stay valid. A failure on any rank leaves every rank's old allocator and
every mapped byte as they were, and every rank raises the same error.
"""

from __future__ import annotations

from typing import Any

from kvcache.runtime.agreed_resize import agree_on_resize
from kvcache.configurator import KVCacheConfigResult
from kvcache.sizing.runtime_reserve import RuntimeShape, runtime_reserve_mib
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.inputs.parallel import ParallelState
from kvcache.runtime.resize import PostCaptureKVResize, compute_post_capture_kv_resize, post_capture_headroom_bytes
from kvcache.runtime.live_resize import resize_live_pools, resize_slack_bytes
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.memory.vmm_storage import VmmBacking
from kvcache.pools.allocator_protocol import AllocatorFactory


def eager_activation_reserve_mib(settings: SizingSettings, parallel_state: ParallelState, total_bytes: int) -> Any:
    """SGLang 0.5.23's pre-capture activation reserve: the runtime reserve without any graph term."""
    return runtime_reserve_mib(total_bytes, RuntimeShape(
        cuda_graphs=False, chunked_prefill_size=settings.chunked_prefill_size, tp_size=parallel_state.tp_size,
        pp_size=parallel_state.pp_size,
    ))


def apply_post_capture_resize(
    *, kv_cache: KVCacheConfigResult, backing: VmmBacking, settings: SizingSettings, parallel_state: ParallelState,
    memory_probe: MemoryProbe, pre_model_load_memory: int, captured_max_bs: int,
    allocator_factory: AllocatorFactory,
) -> tuple[PostCaptureKVResize, Any, int]:
    """(the decision, the allocator to use from now on, device bytes released).

    The slack taken off the budget (kvcache.runtime.live_resize.resize_slack_bytes) covers whole granules kept
    at each buffer's end and the new allocator's lists, the resized plan's allocator slots, allocated beside the
    old ones outside the worker's arena (the old lists stay in it); `allocator_factory` is the worker's (the one
    that built the pools), and it builds the new allocator for the resized plan.
    """
    plan = kv_cache.memory_pool_config
    slack = resize_slack_bytes(backing=backing, pool=kv_cache.token_to_kv_pool, plan=plan,
                               allocator=kv_cache.token_to_kv_pool_allocator)  # shrink-only: at most `plan`'s lists
    card = memory_probe.device_capacity_bytes()  # SGLang's reserve reads nvidia-smi's total
    headroom = post_capture_headroom_bytes(
        plan=plan, pre_model_load_bytes=pre_model_load_memory, cuda_graph_max_bs=captured_max_bs,
        activation_reserve_mib=eager_activation_reserve_mib(settings, parallel_state, card),
    )
    ranks = parallel_state.agreement  # one rank that cannot resize stops all; all keep the smallest count
    resize = ranks.run_everywhere(lambda: compute_post_capture_kv_resize(
        plan=plan, free_after_capture_bytes=memory_probe.free_bytes(), headroom_bytes=headroom,
        mapping_slack_bytes=slack,
    ))
    resize = agree_on_resize(resize, ranks)
    if not resize.changed:
        return resize, kv_cache.token_to_kv_pool_allocator, 0
    done = resize_live_pools(pool=kv_cache.token_to_kv_pool, allocator=kv_cache.token_to_kv_pool_allocator,
                             backing=backing, plan=resize.after, ranks=ranks, allocator_factory=allocator_factory)
    return resize, done.allocator, done.released_bytes
