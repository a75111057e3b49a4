"""The paged Triton kernels (one launch per alloc_decode / alloc_extend) hand out exactly the
indices the host-planned path does, for batches that cross the kernels' block sizes, int32 and
int64 lengths, and page sizes 1, 16, 64. Those run on CUDA, or on the CPU under Triton's
interpreter (TRITON_INTERPRET=1 with NumPy installed). Wherever Triton is installed (it comes
with torch's CUDA build), the kernels are also compiled for an H200 (sm_90) on the CPU."""

from __future__ import annotations

import os
import random

import pytest
import torch

from kvcache.allocators import PagedTokenToKVPoolAllocator
from kvcache.allocators import paged_kernels
from kvcache.testing.allocator_plans import paged_allocator, swa_allocator

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
KERNELS = paged_kernels.load() if DEVICE.type == "cuda" or INTERPRETED else None

runs_kernels = pytest.mark.skipif(KERNELS is None, reason="needs CUDA with Triton, or TRITON_INTERPRET=1 with NumPy")


def pair(ps: int, size: int = 1 << 16) -> tuple[PagedTokenToKVPoolAllocator, PagedTokenToKVPoolAllocator]:
    """A kernel allocator and a host-planned one in the same state (a third of the pool held, in the same order)."""
    a = paged_allocator(size=size, page_size=ps, device=DEVICE, kernels=KERNELS)
    b = paged_allocator(size=size, page_size=ps, device=DEVICE, kernels=None)
    assert a.uses_device_kernels and not b.uses_device_kernels
    for x in (a, b):
        held = x.alloc(size // 3 // ps * ps)
        x.free_page_ids(held[::ps][1::2] // ps)  # free every other page: the free order is not sorted
    return a, b


def decode_batch(rng: random.Random, n: int, ps: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """n requests, about 1/ps of them starting a page; last_loc is consistent with seq_lens."""
    seq = [rng.randrange(1, 40) * ps + rng.randrange(ps) + 1 for _ in range(n)]
    last = [rng.randrange(2, 900) * ps + (s - 2) % ps for s in seq]
    seq_cpu = torch.tensor(seq, dtype=dtype)
    return seq_cpu.to(DEVICE), seq_cpu, torch.tensor(last, dtype=dtype, device=DEVICE)


def extend_batch(rng: random.Random, n: int, ps: int, longest: int, dtype: torch.dtype) -> tuple[object, ...]:
    prefix = [rng.randrange(0, 5 * ps) for _ in range(n)]
    seq = [p + rng.randrange(0, longest) for p in prefix]
    last = [rng.randrange(2, 900) * ps + (p - 1) % ps if p else -1 for p in prefix]
    p_cpu, s_cpu = torch.tensor(prefix, dtype=dtype), torch.tensor(seq, dtype=dtype)
    return (p_cpu.to(DEVICE), p_cpu, s_cpu.to(DEVICE), s_cpu, torch.tensor(last, dtype=dtype, device=DEVICE),
            sum(seq) - sum(prefix))


@runs_kernels
@pytest.mark.parametrize("ps", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_decode_kernel_equals_the_host_plan(ps: int, dtype: torch.dtype) -> None:
    rng = random.Random(ps)
    a, b = pair(ps)
    for n in (1, 7, 256, 257, 700):  # the kernel loops over blocks of 256 requests
        args = decode_batch(rng, n, ps, dtype)
        got, want = a.alloc_decode(*args), b.alloc_decode(*args)
        assert got is not None and want is not None
        assert torch.equal(got, want)
        assert a.available_size() == b.available_size()


@runs_kernels
@pytest.mark.parametrize("ps", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_extend_kernel_equals_the_host_plan(ps: int, dtype: torch.dtype) -> None:
    rng = random.Random(ps + 1)
    a, b = pair(ps)
    for n, longest in ((1, 3), (3, 1300), (5, 1), (130, 40), (0, 1)):  # blocks: 128 requests, 512 tokens
        args = extend_batch(rng, n, ps, longest, dtype)
        got, want = a.alloc_extend(*args), b.alloc_extend(*args)
        assert got is not None and want is not None
        assert torch.equal(got, want), (n, longest)
        assert a.available_size() == b.available_size()


def strided(values: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other element of a longer tensor)."""
    wide = torch.full((2 * values.numel(),), 10**6, dtype=values.dtype, device=values.device)
    wide[::2] = values
    return wide[::2]


@runs_kernels
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_kernels_read_strided_length_and_last_loc_views_by_their_strides(dtype: torch.dtype) -> None:
    rng = random.Random(5)
    a, b = pair(16)
    seq, seq_cpu, last = decode_batch(rng, 9, 16, dtype)
    views = (strided(seq), seq_cpu.to(torch.int64), strided(last))
    assert not views[0].is_contiguous()
    got, want = a.alloc_decode(*views), b.alloc_decode(seq, seq_cpu, last)
    assert got is not None and want is not None and torch.equal(got, want)
    prefix, prefix_cpu, seq, seq_cpu, last, tokens = extend_batch(rng, 9, 16, 40, dtype)
    got = a.alloc_extend(strided(prefix), prefix_cpu, strided(seq), seq_cpu, strided(last), tokens)
    want = b.alloc_extend(prefix, prefix_cpu, seq, seq_cpu, last, tokens)
    assert got is not None and want is not None and torch.equal(got, want)


@runs_kernels
def test_kernel_decode_refuses_a_bool_last_loc_as_the_host_path_does() -> None:
    a, b = pair(16)
    seq_cpu = torch.tensor([18, 33])
    for x in (a, b):
        with pytest.raises(ValueError, match="last_loc must be an integer tensor"):
            x.alloc_decode(seq_cpu.to(DEVICE), seq_cpu, torch.tensor([True, False], device=DEVICE))


@runs_kernels
def test_kernel_steps_refuse_a_batch_that_does_not_fit_and_change_nothing() -> None:
    a, _ = pair(16, size=16 * 64)
    free = a.available_size()
    rng = random.Random(3)
    args = extend_batch(rng, 2, 16, 2000, torch.int64)
    assert a.alloc_extend(*args) is None and a.available_size() == free


@runs_kernels
def test_check_frees_catches_device_lengths_that_differ_from_the_cpu_copies() -> None:
    a = paged_allocator(size=1024, page_size=16, device=DEVICE, check_frees=True, kernels=KERNELS)
    seq_cpu = torch.tensor([17, 18])
    last = torch.tensor([15, 40], device=DEVICE)
    with pytest.raises(ValueError, match="seq_lens on the device differs from seq_lens_cpu"):
        a.alloc_decode((seq_cpu + 1).to(DEVICE), seq_cpu, last)


@runs_kernels
def test_swa_sides_share_one_count_and_both_run_the_kernel() -> None:
    swa = swa_allocator(full_size=1 << 14, swa_size=1 << 12, page_size=16, device=DEVICE)
    assert swa.full_attn_allocator.uses_device_kernels == (KERNELS is not None and DEVICE.type == "cuda")
    prefix_cpu, seq_cpu = torch.tensor([0, 0]), torch.tensor([40, 17])
    out = swa.alloc_extend(prefix_cpu.to(DEVICE), prefix_cpu, seq_cpu.to(DEVICE), seq_cpu,
                           torch.tensor([-1, -1], device=DEVICE), 57)
    assert out is not None and out.numel() == 57
    assert swa.full_attn_allocator.available_size() == (1 << 14) - 16 * 5


def _compile_for_hopper(kernel: object, signature: dict[str, str], constexprs: dict[str, int]) -> str:
    """PTX for an H100/H200 (sm_90), compiled on this machine without a GPU (Triton ships ptxas)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names  # type: ignore[attr-defined]
    source = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


@pytest.mark.skipif(INTERPRETED or paged_kernels.load() is None, reason="needs Triton, compiling (not interpreting)")
@pytest.mark.parametrize("index", ["i64", "i32"])
def test_the_kernels_compile_for_an_h200_on_any_machine(index: str) -> None:
    kernels = paged_kernels.load()
    assert kernels is not None
    decode = {"seq_ptr": f"*{index}", "last_ptr": f"*{index}", "log_ptr": "*i64", "head": "i64", "out_ptr": "*i64",
              "batch": "i32", "page_size": "i32", "BLOCK": "constexpr"}
    extend = {"prefix_ptr": f"*{index}", "seq_ptr": f"*{index}", "last_ptr": f"*{index}", "log_ptr": "*i64",
              "head": "i64", "out_ptr": "*i64", "page_size": "i32", "BLOCK_R": "constexpr", "BLOCK_T": "constexpr"}
    assert ".entry decode_kernel" in _compile_for_hopper(kernels.decode_kernel, decode,
                                                         {"BLOCK": paged_kernels.DECODE_BLOCK})
    assert ".entry extend_kernel" in _compile_for_hopper(kernels.extend_kernel, extend, {
        "BLOCK_R": paged_kernels.EXTEND_BLOCK_REQUESTS, "BLOCK_T": paged_kernels.EXTEND_BLOCK_TOKENS})


class _RecordingKernel:
    """Stands in for a Triton kernel: records the CUDA device current when it is launched."""

    def __init__(self, current: list[int]) -> None:
        self.current, self.launched_on = current, []

    def __getitem__(self, grid: object) -> object:
        return lambda *args, **kwargs: self.launched_on.append(self.current[0])


class _OnCuda1(torch.Tensor):
    """A CPU tensor that says it lives on cuda:1 (all the launcher asks of its output)."""

    def get_device(self) -> int:  # type: ignore[override]
        return 1


def test_launches_run_on_the_allocators_device_not_the_current_one(mocker) -> None:
    """Triton launches on the current device: an allocator on cuda:1 while cuda:0 is current must switch first."""
    current = [0]

    class Switch:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> None:
            self.saved, current[0] = current[0], self.index

        def __exit__(self, *exc: object) -> None:
            current[0] = self.saved

    mocker.patch.object(torch.cuda, "current_device", side_effect=lambda: current[0])
    mocker.patch.object(torch.cuda, "device", Switch)
    decode_kernel, extend_kernel = _RecordingKernel(current), _RecordingKernel(current)
    kernels = paged_kernels.PagedKernels(decode_kernel=decode_kernel, extend_kernel=extend_kernel)
    lengths, out = torch.ones(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64).as_subclass(_OnCuda1)
    kernels.alloc_decode(lengths, lengths, lengths, 0, out, 16)
    kernels.alloc_extend(lengths, lengths, lengths, lengths, 0, out, 16)
    assert decode_kernel.launched_on == [1] and extend_kernel.launched_on == [1] and current == [0]
    current[0] = 1  # already current: no switch
    kernels.alloc_decode(lengths, lengths, lengths, 0, out, 16)
    assert decode_kernel.launched_on == [1, 1]
