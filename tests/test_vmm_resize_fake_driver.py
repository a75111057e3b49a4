"""The CUDA-only resize paths run on the CPU through the fake VMM driver (kvcache.testing.virtual_memory): a
worker's arena on VmmBacking (the configurator's arena_backing), the post-capture resize and the measured
sizing's resize_pools releasing KV tails in the same addresses, the fresh allocator carved from an arena of its
own (not a second VMM arena), and every VMM byte released when the engine goes. Only what needs the device is
stood in for: the eligibility's device check, graph capture (no graphs on the CPU) and the step's measurement."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import Any

import pytest
import torch
from dependency_injector import providers

import app.forward.measured_sizing as measured_sizing
import app.model_runner as model_runner
from app.forward.graphs import GraphCapture
from app.forward.measured_sizing import resize_pools
from containers import EngineContainer
from kvcache.allocators.factory import allocator_for_plan
from kvcache.byte_units import GiB, MiB
from kvcache.errors import PoolOutOfMemoryError, VmmError
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.device_buffers import Arena
from kvcache.memory.memory_probe import FixedMemoryProbe
from kvcache.memory.vmm_storage import VmmAllocation, VmmBacking
from kvcache.runtime.live_resize import mapping_targets
from kvcache.runtime.measured_headroom import StepPeak
from kvcache.runtime.resize import resized_plan_request
from kvcache.runtime.shrink import pool_buffers
from kvcache.sizing import worker_sizing
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.testing import FixedActivationStep, tiny_model_config
from kvcache.testing.fakes import FailingAllocatorFactory
from kvcache.testing.virtual_memory import FakeVirtualMemory

CARD = 64 * MiB  # a small simulated card: the arena is a few MiB of CPU memory
G = 4096  # the fake driver's granularity


class FakeVmm:
    """The fake driver behind every VmmBacking the runner makes, and those backings."""

    def __init__(self) -> None:
        self.memory = FakeVirtualMemory(granularity=G, capacity_bytes=GiB)
        self.backings: list[VmmBacking] = []

    def backing(self) -> VmmBacking:
        made = VmmBacking(chunk_bytes=64 * G, memory=lambda device: self.memory)
        self.backings.append(made)
        return made

    def allocation(self) -> VmmAllocation:
        (backing,) = self.backings
        (allocation,) = backing.allocations
        return allocation


@pytest.fixture
def vmm(monkeypatch: pytest.MonkeyPatch) -> FakeVmm:
    """Pools built resizable on the CPU: the eligibility rule as on CUDA, VMM on the fake driver."""
    real = worker_sizing.post_capture_eligibility
    monkeypatch.setattr(worker_sizing, "post_capture_eligibility", lambda **kw: real(**{**kw, "device_type": "cuda"}))
    fake = FakeVmm()
    monkeypatch.setattr(model_runner, "VmmBacking", fake.backing)
    return fake


def _engine(probe: FixedMemoryProbe, **args: Any) -> EngineContainer:
    server_args = ServerArgs.from_mapping({"device": "cpu", "memory_limit": probe.total_bytes(), "page_size": 16,
                                           "max_running_requests": 8, "cuda_graph_max_bs": 8, **args})
    engine = EngineContainer(server_args=server_args, model_config=tiny_model_config())
    engine.memory_probe.override(probe)
    return engine


def _capture_without_graphs(runner: Any, probe: FixedMemoryProbe) -> None:
    """Graph capture stood in for: what it would record for batches 1..8, taking no memory."""
    def capture(max_bs: int | None = None) -> GraphCapture:
        free = probe.free_bytes()
        runner.graph_capture = GraphCapture(batch_sizes=(1, 2, 4, 8), free_before_bytes=free, free_after_bytes=free,
                                            seconds=0.0)
        return runner.graph_capture
    runner.capture_decode_graphs = capture


def _mark_first_bytes(buffers: list[torch.Tensor], nbytes: int) -> None:
    """Buffer i's first `nbytes` set to i + 1."""
    for i, t in enumerate(buffers):
        t.view(-1).view(torch.uint8)[:nbytes].fill_(i + 1)


def _marked(buffers: list[torch.Tensor], nbytes: int) -> bool:
    return all(bool((t.view(-1).view(torch.uint8)[:nbytes] == i + 1).all()) for i, t in enumerate(buffers))


def _arenas_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every Arena constructed from now on (a fresh allocator's own arena among them)."""
    made: list[int] = []
    real = Arena.__init__

    def counted(arena: Arena, nbytes: int, *args: Any, **kwargs: Any) -> None:
        real(arena, nbytes, *args, **kwargs)
        made.append(nbytes)
    monkeypatch.setattr(Arena, "__init__", counted)
    return made


def _inside(t: torch.Tensor, a: VmmAllocation) -> bool:
    return a.base <= t.data_ptr() < a.base + a.reserved


def _tensors_into(base: int, end: int) -> int:
    """Live tensors whose data lies in [base, end) (after a collection): on CUDA any keeps the allocation mapped."""
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.device.type == "cpu"
               and o.layout == torch.strided and o.numel() and base <= o.data_ptr() < end)


def _watch(vmm: FakeVmm) -> tuple[weakref.ref[VmmAllocation], int, int]:
    allocation = vmm.allocation()
    return weakref.ref(allocation), allocation.base, allocation.base + allocation.reserved


def _every_vmm_byte_released(vmm: FakeVmm, watched: tuple[weakref.ref[VmmAllocation], int, int], *,
                              scan_tensors: bool = True) -> None:
    """Once the engine is gone: no tensor over the VMM arena lives on (on CUDA any would keep it mapped; the fake's
    allocation lives only as long as the arena's own tensor), the allocation is closed and the driver holds no
    physical memory."""
    ref, base, end = watched
    gc.collect()
    if scan_tensors:
        assert _tensors_into(base, end) == 0
    assert ref() is None and vmm.memory.physical_bytes == 0


def test_the_post_capture_resize_releases_kv_tails_of_the_vmm_arena_and_keeps_everything_else(
        vmm: FakeVmm, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = FixedMemoryProbe(total_bytes=CARD)
    engine = _engine(probe, enable_post_capture_kv_resize=True, kv_headroom="fraction", mem_fraction_static=0.5)
    runner = engine.engine().target
    runner.initialize()
    plan, allocation = runner.memory_pool_config, vmm.allocation()
    assert vmm.memory.physical_bytes == plan.arena_bytes() == runner.kv_cache.allocated_bytes  # the arena is the VMM
    built = runner.kv_cache
    assert all(_inside(t, allocation) for t in (*built.req_to_token_pool.named_tensors().values(),
                                                *built.token_to_kv_pool_allocator.named_tensors().values(),
                                                *built.token_to_kv_pool.named_tensors().values()))
    built.req_to_token_pool.req_to_token.fill_(7)
    buffers = pool_buffers(built.token_to_kv_pool)
    _mark_first_bytes(buffers, 1000)  # rows the resize keeps
    old_allocator = built.token_to_kv_pool_allocator
    del built
    probe.note_allocation(probe.free_bytes() - 24 * MiB)  # capture left 24 MiB free, under the 32 MiB headroom
    _capture_without_graphs(runner, probe)
    arenas = _arenas_made(monkeypatch)

    resize = runner.start_decode_runtime()

    assert resize is runner.post_capture_kv_resize and resize.changed and resize.headroom_bytes == CARD // 2
    released = runner.post_capture_released_bytes
    assert released > 0 and vmm.memory.physical_bytes == plan.arena_bytes() - released  # what the driver unmapped
    assert vmm.memory.physical_bytes <= resize.after.arena_bytes() + resize.mapping_slack_bytes
    assert vmm.allocation() is allocation  # no second VMM arena
    assert bool((runner.req_to_token_pool.req_to_token == 7).all())
    assert _marked(buffers, 1000)
    allocator = runner.token_to_kv_pool_allocator
    assert allocator is not old_allocator and allocator.size == resize.tokens_after == runner.token_to_kv_pool.size
    assert arenas == [allocator.nbytes] == [resize.after.allocator_index_bytes]  # its lists' bytes, not 10 MiB
    assert not any(_inside(t, allocation) for t in allocator.named_tensors().values())  # an arena of its own
    assert allocator.alloc(resize.tokens_after) is not None and allocator.alloc(16) is None

    watched = _watch(vmm)
    engine.shutdown_resources()
    del engine, runner, allocator, old_allocator, buffers, allocation, resize
    _every_vmm_byte_released(vmm, watched)


def test_the_measured_sizing_resizes_twice_in_the_same_vmm_allocation_with_a_fresh_allocator_each_time(
        vmm: FakeVmm, monkeypatch: pytest.MonkeyPatch) -> None:
    def measured(name: str, run: Any, device: torch.device) -> StepPeak:  # torch.cuda's statistics stood in for
        run()
        return StepPeak(name=name, torch_peak_bytes=MiB, free_drop_bytes=0, lasting_bytes=0)
    monkeypatch.setattr(measured_sizing, "measure_step", measured)
    allocators: list[Any] = []
    given_views: list[bool] = []

    def factory(**kwargs: Any) -> Any:
        given_views.append(kwargs.get("views") is not None)
        allocators.append(allocator_for_plan(**kwargs))
        return allocators[-1]
    probe = FixedMemoryProbe(total_bytes=GiB)  # SGLang's fraction for it is our 0.05 floor: 40 MiB of pools
    engine = _engine(probe, chunked_prefill_size=256)
    engine.target.worst_case_step.override(providers.Callable(FixedActivationStep.factory({"prefill_chunk": MiB})))
    engine.target.allocator_factory.override(providers.Callable(factory))
    runner = engine.engine().target
    runner.initialize()
    arena_bytes, built_allocator = runner.memory_pool_config.arena_bytes(), runner.token_to_kv_pool_allocator
    allocators.clear()  # the builder's
    _capture_without_graphs(runner, probe)
    arenas = _arenas_made(monkeypatch)

    m = runner.start_decode_runtime()

    assert m is runner.measured_sizing and [s.name for s in m.steps] == ["prefill_chunk"]
    assert m.tokens_built == m.static_tokens == m.tokens_after  # this card's plans are the same: shrink, then grow
    assert given_views == [True, False, False]  # the builder's views; each resize's allocator carves its own lists
    assert len(allocators) == 2 and runner.token_to_kv_pool_allocator is allocators[-1] is not built_allocator
    assert runner.token_to_kv_pool_allocator.size == m.tokens_after == runner.max_total_num_tokens
    assert arenas == [a.nbytes for a in allocators] == [m.plan_after.allocator_index_bytes] * 2  # lists only
    allocation = vmm.allocation()  # still the one arena, all of it mapped
    assert vmm.memory.physical_bytes == arena_bytes == allocation.reserved
    assert not any(_inside(t, allocation) for a in allocators for t in a.named_tensors().values())
    first = weakref.ref(allocators.pop(0))
    assert first() is None  # the static plan's allocator went with its plan

    watched = _watch(vmm)
    engine.shutdown_resources()
    del engine, runner, built_allocator, allocation, m
    allocators.clear()
    _every_vmm_byte_released(vmm, watched, scan_tensors=False)  # the first test scans for views left alive


def test_resize_pools_shrinks_then_grows_back_in_the_same_addresses(make_engine: Any) -> None:
    """Measured sizing's two moves on a worker built on the fake driver: down to a smaller plan (tails unmapped,
    kept rows intact) and back up to the plan it was built for (every byte mapped again, no buffer moved)."""
    memory = FakeVirtualMemory(granularity=G, capacity_bytes=GiB)
    backing = VmmBacking(chunk_bytes=64 * G, memory=lambda device: memory)
    engine = make_engine(kv_cache_memory=24 * MiB, page_size=16, max_running_requests=8,
                         probe=FixedMemoryProbe(total_bytes=GiB))
    configurator = dataclasses.replace(engine.target.configurator(), arena_backing=backing)
    kv = configurator.configure(pre_model_load_memory=GiB)
    built = kv.memory_pool_config
    (allocation,) = backing.allocations
    buffers = pool_buffers(kv.token_to_kv_pool)
    addresses = [t.data_ptr() for t in buffers]
    smaller = plan_pool_sizes(resized_plan_request(built, 12 * MiB))
    assert smaller.max_total_num_tokens < built.max_total_num_tokens
    kept_bytes = (smaller.max_total_num_tokens + smaller.page_size) * buffers[0][0].nbytes
    _mark_first_bytes(buffers, kept_bytes)
    kv.req_to_token_pool.req_to_token.fill_(7)

    down = resize_pools(kv_cache=kv, backing=backing, plan=smaller, allocator_factory=allocator_for_plan,
                        ranks=RankAgreement.alone())

    row = buffers[0][0].nbytes
    tails = len(buffers) * (built.max_total_num_tokens - smaller.max_total_num_tokens) * row
    assert 0 < built.arena_bytes() - memory.physical_bytes <= tails  # whole granules of the tails, no more
    assert built.arena_bytes() - memory.physical_bytes >= tails - 2 * G * len(buffers)
    assert down.size == smaller.max_total_num_tokens == kv.token_to_kv_pool.size
    assert not any(_inside(t, allocation) for t in down.named_tensors().values())
    assert _marked(buffers, kept_bytes)
    assert bool((kv.req_to_token_pool.req_to_token == 7).all())

    up = resize_pools(kv_cache=kv, backing=backing, plan=built, allocator_factory=allocator_for_plan,
                      ranks=RankAgreement.alone())

    assert memory.physical_bytes == allocation.mapped_bytes == allocation.reserved == built.arena_bytes()
    assert up.size == built.max_total_num_tokens == kv.token_to_kv_pool.size
    assert [t.data_ptr() for t in pool_buffers(kv.token_to_kv_pool)] == addresses
    assert _marked(buffers, kept_bytes)


def test_a_buffer_with_no_rows_to_release_releases_nothing_even_at_the_allocations_very_end() -> None:
    """A KV buffer that ends the arena exactly (its slots fill the 2 MiB-rounded arena) keeping all its rows (the
    measured sizing keeps the built plan) has an empty tail at base + reserved, which no allocation holds."""
    memory = FakeVirtualMemory(granularity=G)
    backing = VmmBacking(chunk_bytes=G, memory=lambda device: memory)
    flat = backing(2 * G, torch.device("cpu"))  # the fake's allocation lives as long as this tensor (an arena's)
    buffer = flat.view(2, G)  # two rows of one granule: the whole allocation
    (allocation,) = backing.allocations
    assert mapping_targets(backing, [buffer], 1) == [(allocation, [(0, G)])]
    assert mapping_targets(backing, [buffer], 2) == [(allocation, [(0, 2 * G)])]  # was: KeyError, the empty tail's
    # address is in no allocation


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory (injected)"),
                                   RuntimeError("a bug in the allocator (injected)")], ids=["oom", "bug"])
def test_a_build_that_fails_on_vmm_storage_leaves_nothing_mapped_and_nothing_to_resize(vmm: FakeVmm,
                                                                                       error: Exception) -> None:
    """The arena is handed to the builder on VMM storage; a build that fails after it was carved frees it at once
    (by reference count, as CUDA frees it: no collection), and the runner keeps no backing to resize."""
    engine = _engine(FixedMemoryProbe(total_bytes=CARD), enable_post_capture_kv_resize=True,
                     kv_headroom="fraction", mem_fraction_static=0.5)
    engine.target.allocator_factory.override(providers.Callable(FailingAllocatorFactory(error)))
    runner = engine.engine().target
    with pytest.raises((PoolOutOfMemoryError, RuntimeError), match="injected"):
        runner.initialize()
    (backing,) = vmm.backings
    assert vmm.memory.physical_bytes == 0 and backing.allocations == () and runner._vmm_backing is None
    engine.shutdown_resources()


@pytest.mark.parametrize(("call", "after"), [("unmap", 3), ("create", 0), ("map", 0)])
def test_a_post_capture_resize_the_driver_fails_leaves_the_vmm_arena_mapped_and_the_old_allocator_whole(
        vmm: FakeVmm, call: str, after: int) -> None:
    """The driver failing mid-release (an unmap, or a straddling chunk's replacement that cannot be made or mapped):
    every byte of the arena is mapped again, the kept bytes are unchanged, and the worker keeps its plan, its
    pools' size and its allocator with every free token free."""
    probe = FixedMemoryProbe(total_bytes=CARD)
    engine = _engine(probe, enable_post_capture_kv_resize=True, kv_headroom="fraction", mem_fraction_static=0.5)
    runner = engine.engine().target
    runner.initialize()
    plan, allocator = runner.memory_pool_config, runner.token_to_kv_pool_allocator
    free, size = allocator.available_size(), runner.token_to_kv_pool.size
    buffers = pool_buffers(runner.token_to_kv_pool)
    _mark_first_bytes(buffers, 1000)
    runner.req_to_token_pool.req_to_token.fill_(7)
    probe.note_allocation(probe.free_bytes() - 24 * MiB)
    _capture_without_graphs(runner, probe)
    vmm.memory.fail(call, after=after)

    with pytest.raises(VmmError, match="injected"):
        runner.start_decode_runtime()

    assert vmm.memory.physical_bytes == plan.arena_bytes() == vmm.allocation().mapped_bytes
    assert runner.memory_pool_config is plan and runner.token_to_kv_pool_allocator is allocator
    assert runner.token_to_kv_pool.size == size and allocator.available_size() == free
    assert _marked(buffers, 1000) and bool((runner.req_to_token_pool.req_to_token == 7).all())
    engine.shutdown_resources()
