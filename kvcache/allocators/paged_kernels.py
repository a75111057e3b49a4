"""Triton kernels for a paged step on CUDA: alloc_decode and alloc_extend, one launch each.

The host knows how many fresh pages a batch takes (from the CPU lengths SGLang's scheduler
passes) and where they start in the free log (`log[head:head+n]`); the kernel does the rest
on the device, reading the device lengths: which request starts a page, the rank of each
fresh page in request order, and every new token's index. Nothing is planned per token on
the host and nothing is copied host -> device, so a step is one launch and no sync.

A token at position q of request r (positions prefix..seq-1) goes to
    last_loc[r] + 1 + (q - prefix)            while q < ceil(prefix / P) * P (its partial page),
    fresh[k] + q % P, k = first_fresh[r] + (q - ceil(prefix / P) * P) // P   otherwise,
where fresh[k] = log[head + k] is a page's first token index and first_fresh[r] is the
number of fresh pages the requests before r take. Decode is the case seq - prefix = 1.

The kernels index their inputs as dense arrays, so the launchers pass strided views as
contiguous copies (a no-op for the contiguous tensors SGLang's scheduler passes), and they
launch on the output's device (Triton would use the current one).

Block sizes are fixed (loops cover any batch), so a kernel compiles once per index dtype, not
once per batch size; the per-step integers are not specialized on. `triton` is imported only
by `load()`, on CUDA (under Triton's CPU interpreter, TRITON_INTERPRET=1 with NumPy, the
same kernels run on CPU tensors: tests/test_paged_kernels.py uses that off the GPU).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

DECODE_BLOCK = 256  # requests per loop step of the decode kernel (one program)
EXTEND_BLOCK_REQUESTS = 128  # requests per loop step when a program sums the ones before it
EXTEND_BLOCK_TOKENS = 512  # tokens per loop step of one request's program


def on_device_of(out: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Where a launch must run: Triton launches on the current CUDA device, so an allocator on cuda:1 while
    cuda:0 is current switches to its own device for the launch (a no-op when it is already current, or on
    the CPU under Triton's interpreter)."""
    index = out.get_device()
    if index < 0 or index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(index)


@dataclass(frozen=True, slots=True)
class PagedKernels:
    """The compiled-on-first-use kernels and their launchers."""

    decode_kernel: Any
    extend_kernel: Any

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor, log: torch.Tensor, head: int,
                     out: torch.Tensor, page_size: int) -> None:
        """out[i] = a fresh page's first index (taken in request order from log[head:]) or last_loc[i] + 1."""
        with on_device_of(out):
            self.decode_kernel[(1,)](seq_lens.contiguous(), last_loc.contiguous(), log, head, out, out.numel(),
                                     page_size, BLOCK=DECODE_BLOCK)

    def alloc_extend(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor,
                     log: torch.Tensor, head: int, out: torch.Tensor, page_size: int) -> None:
        """out = every new token's index, flat in request order (see the module docstring)."""
        batch = prefix_lens.numel()
        with on_device_of(out):
            self.extend_kernel[(batch,)](prefix_lens.contiguous(), seq_lens.contiguous(), last_loc.contiguous(), log,
                                         head, out, page_size,
                                         BLOCK_R=EXTEND_BLOCK_REQUESTS, BLOCK_T=EXTEND_BLOCK_TOKENS)


@cache
def load() -> PagedKernels | None:
    """The compiled kernels, or None where Triton is missing (the caller then plans on the host)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit(do_not_specialize=["head", "batch"])
    def decode_kernel(seq_ptr, last_ptr, log_ptr, head, out_ptr, batch, page_size, BLOCK: tl.constexpr):
        taken = tl.zeros((), dtype=tl.int64)  # loop-carried: its type must not change inside the loop
        for first in range(0, batch, BLOCK):
            i = first + tl.arange(0, BLOCK)
            inside = i < batch
            seq = tl.load(seq_ptr + i, mask=inside, other=0).to(tl.int64)
            last = tl.load(last_ptr + i, mask=inside, other=0).to(tl.int64)
            starts = ((seq - 1) % page_size == 0) & inside
            rank = taken + tl.cumsum(starts.to(tl.int64), 0) - starts.to(tl.int64)
            fresh = tl.load(log_ptr + head + rank, mask=starts, other=0)
            tl.store(out_ptr + i, tl.where(starts, fresh, last + 1), mask=inside)
            taken += tl.sum(starts.to(tl.int64), 0)

    @triton.jit(do_not_specialize=["head"])
    def extend_kernel(prefix_ptr, seq_ptr, last_ptr, log_ptr, head, out_ptr, page_size,
                      BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
        r = tl.program_id(0)
        out_start = tl.zeros((), dtype=tl.int64)
        first_fresh = tl.zeros((), dtype=tl.int64)
        for first in range(0, r, BLOCK_R):  # the requests before r: their tokens and fresh pages
            j = first + tl.arange(0, BLOCK_R)
            before = j < r
            p = tl.load(prefix_ptr + j, mask=before, other=0).to(tl.int64)
            s = tl.load(seq_ptr + j, mask=before, other=0).to(tl.int64)
            out_start += tl.sum(s - p, 0)
            first_fresh += tl.sum((s + page_size - 1) // page_size - (p + page_size - 1) // page_size, 0)
        prefix = tl.load(prefix_ptr + r).to(tl.int64)
        seq = tl.load(seq_ptr + r).to(tl.int64)
        last = tl.load(last_ptr + r).to(tl.int64)
        page_end = (prefix + page_size - 1) // page_size * page_size  # the end of the partial page
        for first in range(0, seq - prefix, BLOCK_T):
            t = first + tl.arange(0, BLOCK_T)
            inside = t < seq - prefix
            q = prefix + t
            partial = q < page_end
            k = tl.where(partial, 0, (q - page_end) // page_size)
            fresh = tl.load(log_ptr + head + first_fresh + k, mask=inside & (q >= page_end), other=0)
            tl.store(out_ptr + out_start + t, tl.where(partial, last + 1 + t, fresh + q % page_size), mask=inside)

    return PagedKernels(decode_kernel=decode_kernel, extend_kernel=extend_kernel)
