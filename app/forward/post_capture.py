"""Apply the post-capture resize to a worker's live pools (the decision itself is pure: kvcache.runtime).

Measure what is free after capture, decide the smaller plan, rebuild the allocator with
the same tokens in use (refused if any sit in the tail), then unmap every per-layer
buffer's tail in the VMM allocations. Addresses do not move, so captured graphs stay valid.
On several ranks every step ends with the ranks agreeing (kvcache.inputs.rank_agreement): they
agree on the decision and the smallest token count, then all rebuild their allocators
before any releases a byte, then all release; a failure on any rank leaves every rank's
old allocator and every mapped byte as they were, and every rank raises the same error.
"""

from __future__ import annotations

from typing import Any

from kvcache.runtime.agreed_resize import agree_on_resize
from kvcache.configurator import KVCacheConfigResult
from kvcache.memory.runtime_reserve import RuntimeShape, runtime_reserve_mib
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.inputs.parallel import ParallelState
from kvcache.runtime.resize import PostCaptureKVResize, compute_post_capture_kv_resize, post_capture_headroom_bytes
from kvcache.runtime.shrink import AllocatorShrink, complement, pool_buffers, released_address_ranges, shrink_allocator
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.memory.vmm_storage import VmmAllocation, VmmBacking


def eager_activation_reserve_mib(settings: SizingSettings, parallel_state: ParallelState, total_bytes: int) -> Any:
    """SGLang 0.5.23's pre-capture activation reserve: the runtime reserve without any graph term."""
    return runtime_reserve_mib(total_bytes, RuntimeShape(
        cuda_graphs=False, chunked_prefill_size=settings.chunked_prefill_size, tp_size=parallel_state.tp_size,
        pp_size=parallel_state.pp_size,
    ))


def apply_post_capture_resize(
    *, kv_cache: KVCacheConfigResult, backing: VmmBacking, settings: SizingSettings, parallel_state: ParallelState,
    memory_probe: MemoryProbe, pre_model_load_memory: int, captured_max_bs: int,
) -> tuple[PostCaptureKVResize, Any, int]:
    """(the decision, the allocator to use from now on, device bytes released).

    The slack taken off the budget covers whole granules kept at each buffer's end and the
    new allocator's lists, allocated beside the old ones (which stay in the worker's arena).
    """
    plan = kv_cache.memory_pool_config
    pool = kv_cache.token_to_kv_pool
    buffers = pool_buffers(pool)
    total = memory_probe.total_bytes()
    headroom = post_capture_headroom_bytes(
        plan=plan, pre_model_load_bytes=pre_model_load_memory, cuda_graph_max_bs=captured_max_bs,
        activation_reserve_mib=eager_activation_reserve_mib(settings, parallel_state, total),
    )
    ranks = parallel_state.agreement  # one rank that cannot resize stops all; all keep the smallest count
    resize = ranks.run_everywhere(lambda: compute_post_capture_kv_resize(
        plan=plan, free_after_capture_bytes=memory_probe.free_bytes(), headroom_bytes=headroom,
        mapping_slack_bytes=2 * backing.granularity * len(buffers) + plan.allocator_index_bytes,
    ))
    resize = agree_on_resize(resize, ranks)
    if not resize.changed:
        return resize, kv_cache.token_to_kv_pool_allocator, 0
    kept: list[tuple[VmmAllocation, list[tuple[int, int]]]] = []
    shrink: AllocatorShrink | None = None

    def rebuild_allocator() -> None:  # refused (live tokens in the tail) before anything changes
        nonlocal shrink
        kept.extend(kept_ranges(backing, buffers, resize.tokens_after + plan.page_size))
        shrink = shrink_allocator(kv_cache.token_to_kv_pool_allocator, resize.tokens_after)

    try:
        ranks.run_everywhere(rebuild_allocator)  # every rank rebuilt it, or none goes on to release a byte
        released = ranks.run_everywhere(lambda: sum(allocation.keep_only(ranges) for allocation, ranges in kept))
    except BaseException:
        if shrink is not None:
            shrink.undo()  # the old allocator as it was, first: mapping back below can fail too
        _map_back(kept)  # what this rank released when another rank failed (a failing keep_only maps its own back)
        raise
    pool.size = resize.tokens_after
    assert shrink is not None
    return resize, shrink.allocator, released


def _map_back(kept: list[tuple[VmmAllocation, list[tuple[int, int]]]]) -> None:
    """Map every allocation's unmapped ranges again; each is tried, and the first failure is raised after."""
    failure: BaseException | None = None
    for allocation, _ in kept:
        try:
            allocation.map_unmapped()
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def kept_ranges(backing: VmmBacking, buffers: list[Any], rows: int) -> list[tuple[VmmAllocation, list[tuple[int, int]]]]:
    """Each allocation holding a pool buffer, with the [start, end) offsets it keeps when every buffer keeps its
    first `rows` rows; everything else there (the request table and allocator lists share the arena) stays; an
    allocation with nothing to release is left out."""
    tails: dict[int, tuple[VmmAllocation, list[tuple[int, int]]]] = {}
    for start, end in released_address_ranges(buffers, rows):
        allocation = backing.allocation_at(start)
        tails.setdefault(id(allocation), (allocation, []))[1].append((start - allocation.base, end - allocation.base))
    return [(a, complement(ranges, 0, a.reserved)) for a, ranges in tails.values()]
