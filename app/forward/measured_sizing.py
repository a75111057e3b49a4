"""Measured headroom on CUDA: size the KV pools from the worst-case step the engine runs (decisions: kvcache.runtime).

The pools were built for the higher (post-capture) fraction on VMM storage. In order:
1. shrink them to the static plan (SGLang's fraction), so graphs and the step run with the
   memory a static engine would have;
2. capture the decode graphs;
3. run each worst-case step once to warm it up, then once measured, then all of them twice in turn
   (what a running engine alternates between): torch's peak reserved bytes and cudaMemGetInfo's free
   bytes before, right after (blocks still cached) and after the cache is emptied;
4. decide the token count (peak + margin left free; the static plan's tokens at least unless they
   would run out of memory at the step; every rank the smallest), and grow (map the reserved
   addresses again) or shrink (release tails) the pools to it, with a fresh allocator.
Both resizes take kvcache.runtime.live_resize, the post-capture resize's road too: on every rank or
on none. It runs in the bootstrap, before any request holds tokens.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from kvcache.configurator import KVCacheConfigResult
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.memory.vmm_storage import VmmBacking
from kvcache.pools.allocator_protocol import AllocatorFactory
from kvcache.runtime.live_resize import resize_live_pools, resize_slack_bytes
from kvcache.runtime.measured_headroom import StepPeak, WorstCaseStep
from kvcache.sizing.pool_config import MemoryPoolConfig


def measure_step(name: str, run: Callable[[], None], device: torch.device) -> StepPeak:
    """One run of a step, measured by torch's allocator statistics and by cudaMemGetInfo."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free_before = int(torch.cuda.mem_get_info(device)[0])
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_reserved(device) - reserved_before
    free_right_after = int(torch.cuda.mem_get_info(device)[0])
    torch.cuda.empty_cache()
    free_released = int(torch.cuda.mem_get_info(device)[0])
    return StepPeak(name=name, torch_peak_bytes=int(peak), free_drop_bytes=free_before - free_right_after,
                    lasting_bytes=free_before - free_released)


def measure_worst_case(step: WorstCaseStep, device: torch.device) -> tuple[StepPeak, ...]:
    """Each step warmed up (kernels loaded, autotuning settled), then measured alone; with several steps, also
    all of them twice in turn ("alternating"): the caching allocator keeps one step's blocks cached while the
    next, of other sizes, cannot reuse them, so a running engine holds more than its largest step alone."""
    names = step.names()
    for name in names:
        step.run(name)
    peaks = [measure_step(name, lambda: step.run(name), device) for name in names]
    if len(names) > 1:
        def alternating() -> None:
            for _ in range(2):
                for name in names:
                    step.run(name)
        peaks.append(measure_step("alternating", alternating, device))
    return tuple(peaks)


def resize_pools(*, kv_cache: KVCacheConfigResult, backing: VmmBacking, plan: MemoryPoolConfig,
                 allocator_factory: AllocatorFactory, ranks: RankAgreement) -> Any:
    """The pools addressed by `plan`'s tokens (each buffer's first rows mapped, the rest of its reserved
    addresses released) and a fresh allocator for them, on every rank or on none (a collective)."""
    return resize_live_pools(pool=kv_cache.token_to_kv_pool, allocator=kv_cache.token_to_kv_pool_allocator,
                             backing=backing, plan=plan, ranks=ranks, allocator_factory=allocator_factory).allocator


def static_plan(configurator: Any, built: MemoryPoolConfig) -> MemoryPoolConfig:
    """The floor the pools shrink to while the steps are measured (kvcache.sizing.static_floor), agreed by the ranks."""
    from kvcache.sizing.static_floor import static_floor

    return static_floor(configurator.sizing, built, configurator.parallel_state.agreement)


def size_from_worst_case(runner: Any, configurator: Any, make_step: Callable[..., WorstCaseStep]) -> Any:
    """Steps 1-4 of the module docstring on `runner`; returns the MeasuredSizing (the runner's pools, allocator
    and plan are replaced as it goes)."""
    from kvcache.errors import UnsupportedModelError
    from kvcache.sizing.runtime_reserve import default_chunked_prefill_size
    from kvcache.runtime.measured_headroom import MeasuredSizing, agreed_plan, decide_measured_tokens
    from kvcache.sizing.measured_prediction import measured_margin_bytes

    backing, settings, ranks = runner._vmm_backing, configurator.settings, runner.parallel_state.agreement
    built = runner.memory_pool_config
    static = static_plan(configurator, built)
    runner.replace_kv_plan(static, resize_pools(kv_cache=runner.kv_cache, backing=backing, plan=static,
                                                allocator_factory=configurator.allocator_factory, ranks=ranks))
    capture = runner.capture_decode_graphs()
    total = runner.memory_probe.total_bytes()
    margin = measured_margin_bytes(total)
    card = runner.memory_probe.device_capacity_bytes()  # SGLang's card-size defaults read nvidia-smi's total
    try:
        step = make_step(runner=runner,
                         chunked_prefill_size=settings.chunked_prefill_size or default_chunked_prefill_size(card),
                         decode_batch=built.max_running_requests,
                         largest_graph_batch=settings.graph_served_batch(capture.max_bs),
                         mixed_chunk=settings.enable_mixed_chunk)
    except UnsupportedModelError as exc:
        if settings.kv_headroom != "auto":
            raise UnsupportedModelError(f"--kv-headroom measured needs the engine's worst-case step: {exc}; "
                                        "use --kv-headroom fraction") from None
        free = runner.memory_probe.free_bytes()
        return MeasuredSizing(steps=(), graph_bytes=capture.bytes_taken, margin_bytes=margin,
                              tokens_built=built.max_total_num_tokens, static_tokens=static.max_total_num_tokens,
                              tokens_after=static.max_total_num_tokens, free_after_steps_bytes=free,
                              free_after_resize_bytes=free, plan_after=static,
                              note=f"kept the static plan: no worst-case step to measure ({exc})")
    peaks = ranks.run_everywhere(lambda: measure_worst_case(step, runner.device))
    free = runner.memory_probe.free_bytes()
    slack = resize_slack_bytes(backing=backing, pool=runner.token_to_kv_pool, plan=built,  # the largest it grows to
                               allocator=runner.token_to_kv_pool_allocator)
    peak = max((p.peak_bytes for p in peaks), default=0)
    after, note = ranks.run_everywhere(lambda: decide_measured_tokens(
        built=built, static=static, free_at_static_bytes=free, peak_bytes=peak, margin_bytes=margin,
        mapping_slack_bytes=slack))
    (agreed,) = ranks.min_int64((after.max_total_num_tokens,))
    after = ranks.run_everywhere(lambda: agreed_plan(after, built, agreed))
    runner.replace_kv_plan(after, resize_pools(kv_cache=runner.kv_cache, backing=backing, plan=after,
                                               allocator_factory=configurator.allocator_factory, ranks=ranks))
    torch.cuda.empty_cache()
    return MeasuredSizing(steps=peaks, graph_bytes=capture.bytes_taken, margin_bytes=margin,
                          tokens_built=built.max_total_num_tokens, static_tokens=static.max_total_num_tokens,
                          tokens_after=after.max_total_num_tokens, free_after_steps_bytes=free, plan_after=after,
                          note=note, free_after_resize_bytes=runner.memory_probe.free_bytes())
