"""The device work of the hot paths: how many kernels a step launches (on the CPU, counted by
torch's dispatcher, independent of pool size) and, on CUDA, that steady-state steps never
synchronize the host (torch.cuda.set_sync_debug_mode("error") raises on any sync)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvcache.allocators.locations import SMALL_BATCH
from kvcache.testing.allocator_plans import paged_allocator, swa_allocator, token_allocator

CPU = torch.device("cpu")


def _storage(t: Any) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


class KernelLog(TorchDispatchMode):
    """The aten ops that would launch a kernel on the device (views, which launch nothing, left out).

    On the CPU every tensor is a host tensor, so the log follows the data: an op is a device
    op when it reads a tensor stored where the device tensors are (the allocator's free log,
    the device arguments) or one a device op wrote. Host work (the plan from the CPU
    lengths) stays out of the log.
    """

    def __init__(self, device_tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.device = {_storage(t) for t in device_tensors}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [*args, *kwargs.values()]
        flat = [x for a in inputs for x in (a if isinstance(a, (list, tuple)) else [a])]
        out = func(*args, **kwargs)
        on_device = any(_storage(x) in self.device for x in flat)
        if on_device:
            for t in out if isinstance(out, (list, tuple)) else [out]:
                self.device.add(_storage(t))
            if not func.is_view:
                self.ops.append(func.overloadpacket.__name__)
        return out


def kernels(step: Callable[[], object], allocator: Any, *device_args: torch.Tensor) -> list[str]:
    """Device ops of step; device_args are the tensors that would live on the device."""
    logs = [s._log for s in (allocator, getattr(allocator, "full_attn_allocator", None),
                             getattr(allocator, "swa_attn_allocator", None)) if s is not None and hasattr(s, "_log")]
    with KernelLog([log._log for log in logs] + list(device_args)) as log:
        step()
    return log.ops


SYNCING = {"_local_scalar_dense", "nonzero", "unique", "_unique2", "unique_dim", "unique_consecutive", "item",
           "is_nonzero", "equal", "masked_select"}


def half_full(a: Any) -> Any:
    assert a.alloc(a.size // 2 // a.page_size * a.page_size) is not None
    return a


@pytest.mark.parametrize("size", [1_000, 1_000_000])
def test_page_1_alloc_free_cycle_is_one_kernel_at_any_pool_size(size: int) -> None:
    a = half_full(token_allocator(size=size, device=CPU))
    assert kernels(lambda: a.free(a.alloc(256)), a) == ["copy_"]  # alloc is a view; free appends


def test_a_full_log_moves_to_the_other_log_and_handed_out_views_keep_their_values_for_capacity_frees() -> None:
    a = token_allocator(size=8, device=CPU)
    planned = a.nbytes
    kept = a.alloc(3)  # a view of log A[0:3]
    assert kept is not None
    snapshot, ops = kept.clone(), []
    # Log A (16 entries) holds ids 1..8, head 3. Cycle 9's free finds A full (head 12, tail 16) and copies the
    # 4 free ids to B[0:4]; B fills after 11 more frees, so cycle 21 is the first to write A again. The
    # guarantee is capacity (8) frees; 20 cycles hold here.
    for _ in range(20):
        ops += kernels(lambda: a.free(a.alloc(1)), a)
    assert "empty_like" not in ops and torch.equal(kept, snapshot)
    for _ in range(20):  # two more compactions, still no allocation
        ops += kernels(lambda: a.free(a.alloc(1)), a)
    assert "empty_like" not in ops and a.nbytes == planned
    assert a.available_size() == 5


@pytest.mark.parametrize("size", [4_096, 1_048_576])
def test_paged_steps_launch_the_same_few_kernels_at_any_pool_size(size: int) -> None:
    ps = 16
    a = half_full(paged_allocator(size=size, page_size=ps, device=CPU))
    seq = torch.tensor([17, 18, 33, 40])  # requests 0 and 2 start a page
    last = torch.tensor([ps * 3 + 15, ps * 5, ps * 7 + 15, ps * 9 + 6])
    decode = kernels(lambda: a.alloc_decode(seq, seq, last), a, last)
    prefix, new = torch.tensor([8, 32]), torch.tensor([40, 50])
    ext_last = torch.tensor([ps * 3 + 7, ps * 5 + 15])
    out: list[torch.Tensor] = []
    extend = kernels(lambda: out.append(a.alloc_extend(prefix, prefix, new, new, ext_last, 50)), a, ext_last)
    segment = kernels(lambda: a.free_segment(out[0][8:32], start_pos=16), a, out[0])
    page_ids = torch.tensor([2, 3])
    by_id = kernels(lambda: a.free_page_ids(page_ids), a, page_ids)
    big_prefix = torch.arange(SMALL_BATCH + 1) * ps + 3  # more requests than the small-batch path takes
    big_new = big_prefix + 20  # each continues its page and takes a fresh one
    big_last = big_prefix - 1 + ps * 100
    big_extend = kernels(lambda: a.alloc_extend(big_prefix, big_prefix, big_new, big_new, big_last,
                                                20 * (SMALL_BATCH + 1)), a, big_last)
    # on the host path, on the device: an add and an index_copy_ (decode); for a small batch one row of
    # candidates per request and per fresh page (two adds) whose runs are concatenated (extend); for a
    # larger one the partial and fresh pages scattered into a source, a gather and an add (off the CPU
    # also the plan's one asynchronous copy); one append per free. (On CUDA one Triton launch replaces
    # each alloc.)
    assert decode == ["add", "index_copy_"]
    assert extend == ["add", "add", "cat"]
    assert big_extend == ["add", "index_copy_", "index_copy_", "index_select", "add_"]
    assert segment == ["copy_"] and by_id == ["mul"]
    assert not SYNCING & {*decode, *extend, *big_extend, *segment, *by_id}


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_free_group_copies_each_free_and_ends_in_one_kernel(page_size: int) -> None:
    """A group of releases: one copy per deferred free (the caller may overwrite its tensor) and one
    concatenation written straight into the free log at the end (not a cat and then an append)."""
    a = half_full(paged_allocator(size=1 << 14, page_size=page_size, device=CPU) if page_size > 1
                  else token_allocator(size=1 << 14, device=CPU))
    rows = [a.alloc(3 * page_size) for _ in range(3)]
    free = a.available_size()
    a.free_group_begin()
    frees = [kernels(lambda r=r: a.free_segment(r, start_pos=0), a, r) for r in rows]  # type: ignore[misc]
    end = kernels(a.free_group_end, a)
    assert frees == [["_to_copy"]] * 3
    assert end == ["cat"] and a.available_size() == free + 9 * page_size


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_steady_state_steps_never_sync_the_host_on_cuda() -> None:
    dev = torch.device("cuda")
    token = half_full(token_allocator(size=1 << 20, device=dev))
    paged = half_full(paged_allocator(size=1 << 20, page_size=16, device=dev))
    swa = swa_allocator(full_size=1 << 16, swa_size=1 << 14, page_size=16, device=dev)
    seq_cpu = torch.arange(256) * 16 + 1 + (torch.arange(256) % 3)  # some start a page, most continue
    seq = seq_cpu.to(dev)
    last = paged.alloc(256 * 16)[::16].clone() + (seq - 2) % 16  # type: ignore[index]
    prefix_cpu, new_cpu = torch.tensor([0, 8, 16, 3]), torch.tensor([40, 30, 64, 4])
    prefix, new = prefix_cpu.to(dev), new_cpu.to(dev)
    ext_last = torch.tensor([-1, 7, 31, 2], device=dev) + 16 * 100
    starting = seq_cpu.sub(1).remainder(16).eq(0).nonzero().squeeze(1).to(dev)
    torch.cuda.synchronize()

    def steps() -> None:
        token.free(token.alloc(256))
        token.free_group_begin()
        token.free_segment(token.alloc(64), start_pos=0)
        token.free_group_end()
        out = paged.alloc_decode(seq, seq_cpu, last)
        paged.free_page_ids(out[starting] // 16)
        ext = paged.alloc_extend(prefix, prefix_cpu, new, new_cpu, ext_last, int((new_cpu - prefix_cpu).sum()))
        for lo, hi, pos in ((0, 40, 0), (48, 62, 16), (62, 110, 16)):  # each request's fresh pages
            paged.free_segment(ext[lo:hi], start_pos=pos)
        full = swa.alloc_extend(prefix[:1], prefix_cpu[:1], new[:1], new_cpu[:1], ext_last[:1], 40)
        swa.free_swa_segment(full[:16], start_pos=0)
        swa.free_full_segment(full[:16], start_pos=0)
        swa.free_segment(full[16:], start_pos=16)

    steps()  # warm up (first pinned buffers, kernels)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            steps()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert paged.available_size() == (1 << 20) // 2 - 256 * 16
    assert swa.available_size() == 1 << 14


class SyncLog(TorchDispatchMode):
    """The data-dependent (host-syncing on a GPU) aten ops a call runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in SYNCING or (name == "index" and any(getattr(a, "dtype", None) == torch.bool
                                                         for a in args[1] if a is not None)):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_paged_swa_set_free_syncs_twice_find_pages_and_pick_held_ones(page_size: int) -> None:
    swa = swa_allocator(full_size=1024, swa_size=512, page_size=page_size, device=CPU)
    full = swa.alloc(64)
    assert full is not None
    with SyncLog() as log:
        swa.free(full[torch.tensor([0, 1, 2, 17, 40, 41])])
    # torch.unique of the touched pages, then the boolean pick of the ones that still hold an SWA page
    assert [op for op in log.ops if op != "_local_scalar_dense"] in (["_unique2", "index"], ["unique", "index"])
    touched = 6 if page_size == 1 else 3
    assert swa.full_available_size() == 1024 - 64 + touched * page_size
    assert swa.swa_available_size() == 512 - 64 + touched * page_size


class _Kept(TorchDispatchMode):
    """Every tensor created while active, by weak reference: the storages still alive afterwards are what was kept."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor):
                self.made.append(weakref.ref(t))
        return out

    def kept_bytes(self) -> int:
        gc.collect()
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for ref in self.made
                    if (t := ref()) is not None}
        return sum(storages.values())


@pytest.mark.parametrize("make", [
    lambda: token_allocator(size=4096, device=CPU),
    lambda: paged_allocator(size=4096, page_size=16, device=CPU),
    lambda: paged_allocator(size=4096, page_size=64, device=CPU, kernels=None),
    lambda: swa_allocator(full_size=4096, swa_size=1024, page_size=16, device=CPU),
])
def test_an_allocator_keeps_no_memory_beyond_the_bytes_the_plan_counts(make: Callable[[], Any]) -> None:
    """What an allocator holds after construction is its planned index buffers, nothing more (a stray
    device tensor showed up on the H200 as memory_allocated exceeding the plan by 1,024 B)."""
    with _Kept() as kept:
        a = make()
    assert kept.kept_bytes() == a.nbytes
