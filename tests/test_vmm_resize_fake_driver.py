"""The CUDA-only resize paths run on the CPU through the fake VMM driver (kvcache.testing.virtual_memory): a
worker's arena on VmmBacking (the configurator's arena_backing), the post-capture resize and the measured
sizing's resizes releasing KV tails and mapping them again in the same addresses, by the one road
(kvcache.runtime.live_resize), on one rank and on two (threads agreeing through an InProcessGroup) with a
failure injected on one of them; the fresh allocator carved from an arena of its own (not a second VMM arena),
and every VMM byte released when the engine goes. Only what needs the device is stood in for: the eligibility's
device check, graph capture (no graphs on the CPU) and the step's measurement."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from typing import Any

import msgspec
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
from kvcache.errors import PlanMismatchError, PoolOutOfMemoryError, VmmError
from kvcache.inputs.in_process_group import InProcessGroup
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.device_buffers import Arena
from kvcache.sizing.arena_sizes import slot_size
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.memory.vmm_storage import VmmAllocation, VmmBacking
from kvcache.runtime.live_resize import mapping_targets, resize_live_pools
from kvcache.runtime.measured_headroom import StepPeak
from kvcache.sizing.resized_plan import resized_plan_request
from kvcache.runtime.shrink import LiveTokensInTailError, pool_buffers
from kvcache.sizing import worker_sizing
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.testing import FixedActivationStep, tiny_model_config
from kvcache.testing.faults import FaultInjector
from kvcache.testing.fakes import FailingAllocatorFactory
from kvcache.testing.virtual_memory import FakeVirtualMemory
from kvcache.testing.allocator_plans import paged_allocator

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


@dataclasses.dataclass
class FakeWorker:
    """One worker's pools on VMM storage over a fake driver of its own, and the allocator it uses now."""

    memory: FakeVirtualMemory
    backing: VmmBacking
    kv: Any
    allocator: Any = None

    def __post_init__(self) -> None:
        self.allocator = self.allocator or self.kv.token_to_kv_pool_allocator

    def resize(self, plan: Any, ranks: RankAgreement) -> None:
        """The one road to `plan`; the allocator it gives is this worker's from then on."""
        self.allocator = resize_live_pools(pool=self.kv.token_to_kv_pool, allocator=self.allocator,
                                           backing=self.backing, plan=plan, ranks=ranks,
                                           allocator_factory=allocator_for_plan).allocator


def _pools_on_a_fake_driver(make_engine: Any) -> FakeWorker:
    """A tiny page-16 worker's pools (a 24 MiB KV budget) built on VMM storage over a fake driver of its own."""
    memory = FakeVirtualMemory(granularity=G, capacity_bytes=GiB)
    backing = VmmBacking(chunk_bytes=64 * G, memory=lambda device: memory)
    engine = make_engine(kv_cache_memory=24 * MiB, page_size=16, max_running_requests=8,
                         probe=FixedMemoryProbe(total_bytes=GiB))
    configurator = dataclasses.replace(engine.target.configurator(), arena_backing=backing)
    return FakeWorker(memory=memory, backing=backing, kv=configurator.configure(pre_model_load_memory=GiB))


def test_resize_pools_shrinks_then_grows_back_in_the_same_addresses(make_engine: Any) -> None:
    """Measured sizing's two moves on a worker built on the fake driver: down to a smaller plan (tails unmapped,
    kept rows intact) and back up to the plan it was built for (every byte mapped again, no buffer moved)."""
    worker = _pools_on_a_fake_driver(make_engine)
    memory, backing, kv = worker.memory, worker.backing, worker.kv
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


def _numbers_describe(kv: Any, plan: Any, memory: FakeVirtualMemory, *, fresh_allocator: bool) -> None:
    """Every number the worker's result, pool and allocator report is `plan`'s (the tiny model: 2 layers of 2 KV heads
    of 16 bf16 values, 64 B a row per layer for K and as much for V), and what it holds is what the driver maps
    and, after a resize, the fresh allocator's lists beside the arena."""
    pool, allocator, part = kv.token_to_kv_pool, kv.token_to_kv_pool_allocator, plan.pool("full")
    rows = plan.max_total_num_tokens + 16
    assert kv.memory_pool_config is plan and kv.max_total_num_tokens == pool.size == allocator.size == rows - 16
    assert pool.get_kv_size_bytes() == (2 * rows * 64, 2 * rows * 64)
    assert pool.nbytes == part.total_bytes == slot_size(4 * rows * 64)  # 2 layers x K and V, one slot
    planned = {t.name: t.shape for t in part.slot().tensors}
    assert {n: tuple(t.shape) for n, t in pool.named_tensors().items()} == planned
    assert [t.shape for t in allocator.named_tensors().values()] == [t.shape for t in plan.tensors()
                                                                      if t.name.startswith("allocator.")]
    assert allocator.nbytes == plan.allocator_index_bytes == 2 * slot_size(2 * (rows - 16) // 16 * 8)  # two logs
    assert kv.allocated_bytes == memory.physical_bytes + (allocator.nbytes if fresh_allocator else 0)


def test_after_a_shrink_and_a_grow_every_number_describes_the_resized_pools(make_engine: Any) -> None:
    """A resize changes what the pool, the allocator and the result report, not only pool.size: the pool's nbytes,
    named tensors and K/V bytes are the resized plan's rows (the same addresses), the fresh allocator's lists the
    resized plan's, and allocated_bytes what the driver maps now plus the fresh lists beside the arena."""
    worker = _pools_on_a_fake_driver(make_engine)
    kv, memory, built = worker.kv, worker.memory, worker.kv.memory_pool_config
    _numbers_describe(kv, built, memory, fresh_allocator=False)
    assert kv.allocated_bytes == built.arena_bytes() == memory.physical_bytes  # as built: the arena, all mapped
    addresses = {n: t.data_ptr() for n, t in kv.token_to_kv_pool.named_tensors().items()}
    smaller = plan_pool_sizes(resized_plan_request(built, 12 * MiB))

    for plan in (smaller, built):  # a shrink, then a grow back
        worker.resize(plan, RankAgreement.alone())
        kv = kv.resized(plan, worker.allocator)
        _numbers_describe(kv, plan, memory, fresh_allocator=True)
        assert {n: t.data_ptr() for n, t in kv.token_to_kv_pool.named_tensors().items()} == addresses
    assert kv.allocated_bytes == built.arena_bytes() + kv.token_to_kv_pool_allocator.nbytes
    with pytest.raises(PlanMismatchError, match=r"'kv_full' was built with \d+ rows; a resize to \d+ tokens needs"):
        kv.token_to_kv_pool.check_resize(plan_pool_sizes(msgspec.structs.replace(
            resized_plan_request(built, 48 * MiB), max_total_tokens=None)))


def test_the_report_after_a_post_capture_shrink_and_a_grow_back_reads_the_plan_the_pools_hold(vmm: FakeVmm) -> None:
    """What --json and the rank table print after each resize: the resized plan's tokens, buffers and bytes, and as
    allocated the bytes the driver maps now plus the fresh allocator's lists (not the arena as built)."""
    from app.rank_report import rank_plan
    from app.report import build_report
    from kvcache.engines.sglang import SGLANG

    probe = FixedMemoryProbe(total_bytes=CARD)
    engine = _engine(probe, enable_post_capture_kv_resize=True, kv_headroom="fraction", mem_fraction_static=0.5)
    runtime = engine.engine()
    runner = runtime.target
    runner.initialize()
    built = runner.memory_pool_config
    probe.note_allocation(probe.free_bytes() - 24 * MiB)
    _capture_without_graphs(runner, probe)
    shrunk = runner.start_decode_runtime().after
    assert shrunk.max_total_num_tokens < built.max_total_num_tokens

    for plan in (shrunk, built):
        if plan is built:  # mapped again, as the measured sizing's second resize may
            grown = resize_pools(kv_cache=runner.kv_cache, backing=runner._vmm_backing, plan=built,
                                 allocator_factory=allocator_for_plan, ranks=RankAgreement.alone())
            runner.replace_kv_plan(built, grown)
        report = build_report(runtime, rules=SGLANG)
        rank = rank_plan(runtime, report)
        held = vmm.memory.physical_bytes + runner.token_to_kv_pool_allocator.nbytes
        assert report.max_total_num_tokens == rank.max_total_num_tokens == plan.max_total_num_tokens
        assert report.planned_bytes == rank.planned_bytes == plan.total_bytes and report.buffers == plan.buffers
        assert report.plan["kv_pools"][0]["num_rows"] == plan.max_total_num_tokens + 16
        assert report.allocated_bytes == rank.allocated_bytes == held
        assert rank.own_max_total_num_tokens == built.max_total_num_tokens  # as built, and so documented
    assert vmm.memory.physical_bytes == built.arena_bytes()


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


def _on_two_ranks(step: Any) -> list[Any]:
    """step(rank, agreement) on two threads that agree through an InProcessGroup: what each returned or raised."""
    group = InProcessGroup(2)
    out: list[Any] = [None, None]

    def run(rank: int) -> None:
        agreement = RankAgreement(group=group, rank=rank, world_size=2, rank_names=("rank 0", "rank 1"))
        try:
            out[rank] = step(rank, agreement)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            out[rank] = exc
    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a rank still waits at a collective"
    return out


def _state(worker: FakeWorker) -> tuple[Any, ...]:
    """What a failed resize must leave as it was: the physical bytes, what is mapped where, the allocator and its
    free tokens, the pool's size."""
    (allocation,) = worker.backing.allocations
    return (worker.memory.physical_bytes, allocation.mapped_ranges, worker.allocator,
            worker.allocator.available_size(), worker.kv.token_to_kv_pool.size)


@pytest.mark.parametrize(("failing", "call", "after"), [
    ("shrink", "unmap", 3),  # rank 1 fails part-way through releasing its tails (rank 0 released all of its own)
    ("grow", "create", 1),  # rank 1 fails part-way through mapping its tails again (rank 0 mapped all of its own)
])
def test_a_driver_failure_on_one_of_two_ranks_mid_resize_leaves_both_ranks_as_they_were(
        make_engine: Any, failing: str, call: str, after: int) -> None:
    """Two ranks resize by the one road: shrink, then grow back, a failure injected on rank 1 in the middle of one
    of them. Both raise the same typed error, and both keep their allocator (every free token free), their pool
    size and exactly the mapping they had; the next resize then goes through on both."""
    workers = [_pools_on_a_fake_driver(make_engine) for _ in range(2)]
    built = workers[0].kv.memory_pool_config
    smaller = plan_pool_sizes(resized_plan_request(built, 12 * MiB))
    row = pool_buffers(workers[0].kv.token_to_kv_pool)[0][0].nbytes
    kept_bytes = (smaller.max_total_num_tokens + smaller.page_size) * row
    for worker in workers:
        worker.allocator.alloc(64)  # a request's tokens, in the first pages: carried into every new allocator
        _mark_first_bytes(pool_buffers(worker.kv.token_to_kv_pool), kept_bytes)
    if failing == "grow":
        assert _on_two_ranks(lambda rank, ranks: workers[rank].resize(smaller, ranks)) == [None, None]
        assert len(workers[1].backing.allocations[0].mapped_ranges) >= 3  # two tails or more to map back: a middle
    before = [_state(worker) for worker in workers]
    workers[1].memory.fail(call, after=after)
    target = smaller if failing == "shrink" else built

    errors = _on_two_ranks(lambda rank, ranks: workers[rank].resize(target, ranks))

    assert all(isinstance(e, VmmError) for e in errors) and str(errors[0]) == str(errors[1])
    assert str(errors[0]) == f"rank 1: {call} failed (injected)"
    assert [_state(worker) for worker in workers] == before
    assert all(_marked(pool_buffers(worker.kv.token_to_kv_pool), kept_bytes) for worker in workers)

    assert _on_two_ranks(lambda rank, ranks: workers[rank].resize(target, ranks)) == [None, None]
    for worker in workers:
        assert worker.allocator.size == target.max_total_num_tokens == worker.kv.token_to_kv_pool.size
        assert worker.allocator.available_size() == target.max_total_num_tokens - 64
        assert (worker.memory.physical_bytes == built.arena_bytes()) == (target is built)
        assert _marked(pool_buffers(worker.kv.token_to_kv_pool), kept_bytes)


def test_live_tokens_past_the_new_size_on_one_rank_stop_both_before_either_changes(make_engine: Any) -> None:
    workers = [_pools_on_a_fake_driver(make_engine) for _ in range(2)]
    smaller = plan_pool_sizes(resized_plan_request(workers[0].kv.memory_pool_config, 12 * MiB))
    workers[1].allocator.alloc(workers[1].allocator.available_size())  # rank 1 holds every token
    before = [_state(worker) for worker in workers]

    errors = _on_two_ranks(lambda rank, ranks: workers[rank].resize(smaller, ranks))

    assert all(isinstance(e, LiveTokensInTailError) for e in errors) and str(errors[0]) == str(errors[1])
    assert str(errors[0]).startswith("rank 1: ") and "KV tokens in use lie past token" in str(errors[0])
    assert [_state(worker) for worker in workers] == before


def test_a_resized_allocator_still_names_a_double_free(make_engine: Any) -> None:
    """An allocator built with check_frees (by hand: the plan the builder carves has no is_free flags) gets a
    fresh one that checks too, from the factory. Before, a shrink built it without, and a request's tokens freed
    twice while another request held tokens passed unseen (the ids then sat twice in the free list, each to be
    handed to two requests)."""
    worker = _pools_on_a_fake_driver(make_engine)
    pool = worker.kv.token_to_kv_pool
    worker.allocator = paged_allocator(size=pool.size, page_size=16, device=pool.device, check_frees=True,
                                                   kvcache=pool)
    held = worker.allocator.alloc(32)
    worker.allocator.alloc(32)  # another request's
    built = worker.kv.memory_pool_config
    for plan in (plan_pool_sizes(resized_plan_request(built, 12 * MiB)), built):  # a shrink, then a grow
        worker.resize(plan, RankAgreement.alone())
        assert worker.allocator.check_frees
    worker.allocator.free(held)
    with pytest.raises(ValueError, match="double free: page 1 is already free"):
        worker.allocator.free(held)


def _post_capture_start(vmm: FakeVmm, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A runner whose start resizes after "capture" (24 MiB free, under the 32 MiB headroom)."""
    probe = FixedMemoryProbe(total_bytes=CARD)
    runner = _engine(probe, enable_post_capture_kv_resize=True, kv_headroom="fraction",
                     mem_fraction_static=0.5).engine().target
    runner.initialize()
    probe.note_allocation(probe.free_bytes() - 24 * MiB)
    _capture_without_graphs(runner, probe)
    return runner


def _measured_start(vmm: FakeVmm, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A runner whose start sizes by a measured 1 MiB step: to the static plan, then to the measured one."""
    monkeypatch.setattr(measured_sizing, "measure_step", lambda name, run, device: StepPeak(
        name=name, torch_peak_bytes=MiB, free_drop_bytes=0, lasting_bytes=0))
    probe = FixedMemoryProbe(total_bytes=GiB)
    engine = _engine(probe, chunked_prefill_size=256)
    engine.target.worst_case_step.override(providers.Callable(FixedActivationStep.factory({"prefill_chunk": MiB})))
    runner = engine.engine().target
    runner.initialize()
    _capture_without_graphs(runner, probe)
    return runner


@dataclasses.dataclass(slots=True)
class NotingInjector(FaultInjector):
    """A FaultInjector that notes `state()` at each hit of the resize point, before it may fail it."""

    state: Any = None
    noted: list[Any] = dataclasses.field(default_factory=list)

    def hit(self, point: Any) -> None:
        if point == "resize":
            self.noted.append(self.state())
        FaultInjector.hit(self, point)


@pytest.mark.parametrize(("start", "resizes"), [(_post_capture_start, 1), (_measured_start, 2)],
                         ids=["post-capture", "measured"])
def test_the_fault_matrix_resize_point_is_hit_by_every_resize_and_a_fault_there_leaves_the_worker_as_it_was(
        vmm: FakeVmm, monkeypatch: pytest.MonkeyPatch, start: Any, resizes: int) -> None:
    """benchmarks/gpu_fault_matrix.py fails each hit of its `resize` point on the H200; here, on the fake driver,
    each start hits it once per resize, and a fault at any hit (after that resize swapped the allocator) leaves
    the runner's plan, allocator (every token free), pool size and mapped bytes as that resize found them."""
    from test_bench_gpu_fault_matrix import gpu_fault_matrix

    for at in range(resizes + 1):  # 0: a clean start, counting
        runner = start(vmm, monkeypatch)
        (allocation,) = vmm.backings[-1].allocations

        def state() -> tuple[Any, ...]:
            return (runner.memory_pool_config, runner.token_to_kv_pool_allocator, runner.token_to_kv_pool.size,
                    allocation.mapped_bytes, allocation.mapped_ranges)
        injector = NotingInjector(point="resize", at=at, state=state) if at else NotingInjector(state=state)
        with injector.installed(*gpu_fault_matrix.ENGINE_HOOKS):
            if not at:
                runner.start_decode_runtime()
                assert injector.hits["resize"] == resizes
                continue
            with pytest.raises(torch.OutOfMemoryError, match=f"resize #{at}"):
                runner.start_decode_runtime()
        assert injector.fired and len(injector.noted) == at
        assert state() == injector.noted[-1]
        assert runner.token_to_kv_pool_allocator.available_size() == runner.token_to_kv_pool_allocator.size
