"""The one place the engine gets device memory from, and how its bytes are counted.

A worker's KV cache (pools, request table, allocator lists, state) is carved from ONE
`Arena`: each buffer a slot of `slot_size(nbytes)` (512-byte aligned, packed back to
back) in a single allocation of `arena_size(slots)` bytes, a 2 MiB multiple of at least
10 MiB. Dummy weights come from an arena of their own. The CUDA caching allocator serves a request of 10 MiB or more from a segment of
exactly that size (smaller ones share 2 MiB or 20 MiB segments), so the arena lowers
cudaMemGetInfo's free bytes by exactly its size, not only torch.cuda.memory_allocated.
While an arena is `active()`, `allocate_zeros` and `carve` take slots from it instead of
allocating, so pools and allocators need no knowledge of it. Outside an arena (a pool or
allocator built on its own) a buffer takes `allocation_size(nbytes)`, what the caching
allocator gives it: 512-byte blocks up to 1 MiB, 2 MiB multiples above. Tests make the
N-th allocation fail through this module.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import mmap
import weakref
from math import prod
from itertools import accumulate
from typing import Callable, Iterable, Iterator, Sequence

import torch

from kvcache.byte_units import MiB
from kvcache.errors import PlanMismatchError
from kvcache.arithmetic import align_up

BLOCK_ROUND = 512
LARGE_ROUND = 2 * MiB
SMALL_UP_TO = 1 * MiB
HOST_MAP_THRESHOLD = 1 * MiB
OWN_SEGMENT_FROM = 10 * MiB  # the caching allocator's kMinLargeAlloc: requests this big get their own segment
SLOT_ALIGN = 512


def allocation_size(nbytes: int) -> int:
    """Bytes a buffer of `nbytes` really occupies (the formula every plan uses)."""
    if nbytes <= 0:
        return 0
    rounded = align_up(nbytes, BLOCK_ROUND)
    return align_up(rounded, LARGE_ROUND) if rounded > SMALL_UP_TO else rounded


def arena_size(slot_bytes: int) -> int:
    """Bytes of one arena holding `slot_bytes` of slots: a 2 MiB multiple, at least 10 MiB (0 for none)."""
    if slot_bytes <= 0:
        return 0
    return max(align_up(slot_bytes, LARGE_ROUND), OWN_SEGMENT_FROM)


def slot_size(nbytes: int) -> int:
    """Bytes a buffer takes inside an arena: packed back to back, each 512-byte aligned."""
    return align_up(nbytes, SLOT_ALIGN)


CudaBacking = Callable[[int, torch.device], torch.Tensor]
_CUDA_BACKING: contextvars.ContextVar["CudaBacking | None"] = contextvars.ContextVar("cuda_backing", default=None)


@contextlib.contextmanager
def cuda_backing(allocate: CudaBacking) -> Iterator[None]:
    """Inside, large CUDA allocations (an arena among them) come from `allocate(nbytes, device)`, a uint8
    tensor, not the caching allocator: kvcache.memory.vmm_storage backs pools resized after CUDA-graph capture."""
    token = _CUDA_BACKING.set(allocate)
    try:
        yield
    finally:
        _CUDA_BACKING.reset(token)


def _flat(size: int, device: torch.device, *, zeroed: bool) -> torch.Tensor:
    """`size` bytes in one allocation. Large host buffers come from an anonymous mapping, whose
    pages the kernel hands out already zeroed when first touched (no memset faulting in every page)."""
    if device.type == "cpu" and size >= HOST_MAP_THRESHOLD:
        return torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)
    backing = _CUDA_BACKING.get()
    if device.type == "cuda" and backing is not None and size > SMALL_UP_TO:
        flat = backing(size, device)
        return flat.zero_() if zeroed else flat
    if zeroed:
        return torch.zeros(size, dtype=torch.uint8, device=device)
    return torch.empty(size, dtype=torch.uint8, device=device)


_ARENAS: "weakref.WeakValueDictionary[int, Arena]" = weakref.WeakValueDictionary()
_ACTIVE: contextvars.ContextVar["Arena | None"] = contextvars.ContextVar("active_arena", default=None)


class Arena:
    """One allocation that buffers are carved from back to back, each in a slot of `slot_size(n)` bytes."""

    def __init__(self, nbytes: int, device: torch.device, *,
                 zeroed: bool = True) -> None:
        self.nbytes = nbytes
        self.device = device
        self._flat = _flat(nbytes, device, zeroed=zeroed)
        self._starts: list[int] = []
        self._ends: list[int] = []
        _ARENAS[self._flat.untyped_storage()._cdata] = self

    @property
    def used(self) -> int:
        """Bytes of the slots handed out so far."""
        return self._ends[-1] if self._ends else 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The next slot, viewed as `shape`; PlanMismatchError when the arena has no room left for it."""
        if torch.device(device) != self.device:
            raise PlanMismatchError(f"a buffer for {device} was asked of the arena on {self.device}")
        nbytes = prod(shape) * dtype.itemsize
        start, size = self.used, slot_size(nbytes)
        if start + size > self.nbytes:
            raise PlanMismatchError(
                f"a {nbytes:,} B buffer does not fit in the KV arena: {start:,} of {self.nbytes:,} B are taken; "
                "something allocates more than the plan lists"
            )
        self._starts.append(start)
        self._ends.append(start + size)
        return self._flat[start:start + nbytes].view(dtype).view(shape)

    def slot_at(self, offset: int) -> tuple[int, int]:
        """(start, bytes) of the slot holding byte `offset`."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._starts[i], self._ends[i] - self._starts[i]

    @contextlib.contextmanager
    def active(self) -> Iterator["Arena"]:
        """While inside, allocate_zeros and carve take slots from this arena."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


def allocate_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-initialised buffer of `shape`: a slot of the active arena, else its own allocation of
    allocation_size bytes (on `meta`, a shape with no memory behind it)."""
    arena = _ACTIVE.get()
    if arena is not None:
        return arena.take(shape, dtype, device)
    nbytes = prod(shape) * dtype.itemsize
    size = allocation_size(nbytes)
    if size == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    return _flat(size, device, zeroed=True)[:nbytes].view(dtype).view(shape)


def carve(segments: Sequence[tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """One zeroed allocation holding every segment back to back, returned as one tensor per segment.

    A pool takes all its layers' buffers in one allocation, so the allocator's rounding
    costs it at most one block, and one failure leaves nothing half-built.
    """
    sizes = [prod(shape) * dtype.itemsize for shape, dtype in segments]
    for (_, dtype), offset in zip(segments, accumulate([0, *sizes])):
        if offset % dtype.itemsize:
            raise ValueError(f"segment at byte {offset} is not aligned for {dtype}")
    flat = allocate_zeros((sum(sizes),), torch.uint8, device)
    out: list[torch.Tensor] = []
    offset = 0
    for (shape, dtype), size in zip(segments, sizes):
        out.append(flat[offset:offset + size].view(dtype).view(shape))
        offset += size
    return out


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes behind these tensors, rounding included, on any device: each distinct storage
    once, or, for views into an arena, each distinct arena slot once."""
    held: dict[tuple[int, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        arena = _ARENAS.get(storage._cdata)
        if arena is None:
            held[(storage._cdata, -1)] = storage.nbytes()  # views share one storage
        else:
            start, size = arena.slot_at(t.storage_offset() * t.element_size())
            held[(storage._cdata, start)] = size
    return sum(held.values())
