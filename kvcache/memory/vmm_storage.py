"""KV storage on a virtual-memory API: fixed addresses whose physical backing can be given back in part.

A `VmmAllocation` reserves one address range and maps physical blocks into it (one
handle per block, so a block can be unmapped alone). Tensors over it keep their
addresses for life, so CUDA graphs captured against the pools stay valid after
`keep_only` unmaps everything outside the byte ranges still needed
(kvcache.memory.tail_release decides which blocks). A failed `keep_only` leaves every
byte mapped again and the kept bytes unchanged. `VmmBacking` is the allocation function
a worker's arena may be given (kvcache.memory.device_buffers.ArenaBacking).

The driver calls go through a `VirtualMemory`: CUDA's (kvcache.memory.cuda_virtual_memory,
needing the optional cuda-bindings, imported only when a CUDA pool is built this way),
or the CPU fake of kvcache.testing.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol, Sequence

import torch

from kvcache.memory.tail_release import Block, chunk_blocks, plan_tail_release
from kvcache.arithmetic import align_down, align_up

DEFAULT_CHUNK_BYTES = 64 << 20  # handles per GiB stay few; boundary chunks are remapped finer at release


class VirtualMemory(Protocol):
    """The driver calls an allocation makes, on one device."""

    def granularity(self) -> int: ...
    def reserve(self, nbytes: int, alignment: int) -> int: ...
    def free_range(self, address: int, nbytes: int) -> None: ...
    def create(self, nbytes: int) -> Any: ...
    def map(self, address: int, nbytes: int, handle: Any) -> None: ...
    def unmap(self, address: int, nbytes: int) -> None: ...
    def release(self, handle: Any) -> None: ...
    def tensor(self, address: int, nbytes: int, owner: Any) -> torch.Tensor: ...
    def synchronize(self) -> None: ...


def cuda_virtual_memory(device: torch.device) -> VirtualMemory:
    """The CUDA driver's virtual-memory calls for `device`."""
    from kvcache.memory.cuda_virtual_memory import CudaVirtualMemory

    return CudaVirtualMemory(device)


class VmmAllocation:
    """One reserved address range on one device, mapped in blocks; `view` gives uint8 tensors over it."""

    def __init__(self, nbytes: int, device: torch.device, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 memory: VirtualMemory | None = None) -> None:
        self.device = device
        self._vm = memory if memory is not None else cuda_virtual_memory(device)
        self._handles: dict[int, tuple[Block, Any]] = {}  # block offset -> (block, handle)
        self.base = 0
        self.granularity = self._vm.granularity()
        self._chunk = max(self.granularity, chunk_bytes // self.granularity * self.granularity)
        self.nbytes = nbytes
        blocks = chunk_blocks(nbytes, self._chunk, self.granularity)
        self.reserved = sum(b.size for b in blocks)
        self.base = self._vm.reserve(self.reserved, self.granularity)
        try:
            for block in blocks:
                self._map_new(block)
        except BaseException:
            self.close()
            raise

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(sorted((b for b, _ in self._handles.values()), key=lambda b: b.offset))

    @property
    def mapped_bytes(self) -> int:
        return sum(b.size for b, _ in self._handles.values())

    @property
    def mapped_ranges(self) -> list[tuple[int, int]]:
        """The mapped [start, end) offsets, adjacent blocks joined: what a failed resize maps back to exactly."""
        joined: list[tuple[int, int]] = []
        for block in self.blocks:
            if joined and joined[-1][1] == block.offset:
                joined[-1] = (joined[-1][0], block.end)
            else:
                joined.append((block.offset, block.end))
        return joined

    def _map_new(self, block: Block) -> None:
        """Fresh physical memory at `block` (its handle released again if the map fails)."""
        handle = self._vm.create(block.size)
        try:
            self._vm.map(self.base + block.offset, block.size, handle)
        except BaseException:
            self._vm.release(handle)
            raise
        self._handles[block.offset] = (block, handle)

    def _unmap(self, block: Block) -> None:
        """Unmap and release one block; it stays recorded (and mapped) if the unmap fails."""
        _, handle = self._handles[block.offset]
        self._vm.unmap(self.base + block.offset, block.size)
        del self._handles[block.offset]
        self._vm.release(handle)

    def view(self, offset: int, nbytes: int, owner: Any = None) -> torch.Tensor:
        """uint8 [nbytes] at base + offset (owner: what the tensor keeps alive)."""
        return self._vm.tensor(self.base + offset, nbytes, owner)

    def keep_only(self, ranges: Sequence[tuple[int, int]]) -> int:
        """Unmap everything outside `ranges` ([start, end) offsets), keeping their bytes; returns bytes released.

        On failure what this call unmapped is mapped again (with no defined value) and the kept bytes are
        unchanged, then the error is raised: ranges released before stay released (mapping them back would
        take memory that may no longer be free)."""
        self._vm.synchronize()
        before = self.mapped_bytes
        plan = plan_tail_release(self.blocks, ranges, self.granularity)
        touched = [(b.offset, b.offset + b.size) for b in (*plan.dropped, *(old for old, _ in plan.remapped))]
        try:
            for block in plan.dropped:  # first: what they free makes room for the replacements below
                self._unmap(block)
            for old, parts in plan.remapped:
                self._remap(old, parts)
        except BaseException:
            self.map_within(touched)
            raise
        self._vm.synchronize()
        return before - self.mapped_bytes

    def _remap(self, old: Block, parts: tuple[Block, ...]) -> None:
        """Replace a straddling block by `parts`, its kept bytes copied across. The replacements are created
        before the old block is unmapped, and the old handle (still holding its bytes) is mapped back if
        they cannot be mapped: a failure leaves the kept bytes mapped."""
        saved = [self.view(p.offset, p.size).clone() for p in parts]
        handles: list[Any] = []
        try:
            for part in parts:
                handles.append(self._vm.create(part.size))
        except BaseException:
            for handle in handles:
                self._vm.release(handle)
            raise
        self._vm.synchronize()
        _, old_handle = self._handles[old.offset]
        try:
            self._vm.unmap(self.base + old.offset, old.size)  # a failure leaves the old block mapped and recorded
        except BaseException:
            for handle in handles:
                self._vm.release(handle)
            raise
        del self._handles[old.offset]
        mapped: list[Block] = []
        try:
            for part, handle in zip(parts, handles):
                self._vm.map(self.base + part.offset, part.size, handle)
                mapped.append(part)
        except BaseException:
            for part in mapped:
                self._vm.unmap(self.base + part.offset, part.size)
            for handle in handles:
                self._vm.release(handle)
            self._vm.map(self.base + old.offset, old.size, old_handle)
            self._handles[old.offset] = (old, old_handle)
            raise
        for part, handle, data in zip(parts, handles, saved):
            self._handles[part.offset] = (part, handle)
            self.view(part.offset, part.size).copy_(data)
        self._vm.release(old_handle)

    def map_unmapped(self) -> int:
        """Map fresh memory over every unmapped part of the reserved range (values undefined); returns bytes mapped."""
        return self.map_within([(0, self.reserved)])

    def map_within(self, ranges: Sequence[tuple[int, int]]) -> int:
        """Map fresh memory over the unmapped parts of `ranges` ([start, end) offsets, widened to whole granules;
        values undefined): a resized buffer grows back into its reserved addresses. Returns bytes mapped; on a
        failure what this call mapped is unmapped again before the error is raised."""
        g = self.granularity
        wanted = sorted((align_down(start, g), min(align_up(end, g), self.reserved)) for start, end in ranges if end > start)
        mapped: list[Block] = []
        try:
            for start, end in wanted:
                for gap_start, gap_end in self._gaps():
                    lo, hi = max(start, gap_start), min(end, gap_end)
                    for offset in range(lo, hi, self._chunk):
                        block = Block(offset, min(self._chunk, hi - offset))
                        self._map_new(block)
                        mapped.append(block)
        except BaseException:
            for block in mapped:
                self._unmap(block)
            raise
        return sum(b.size for b in mapped)

    def _gaps(self) -> list[tuple[int, int]]:
        """The unmapped [start, end) offsets of the reserved range."""
        cursor, gaps = 0, []
        for block in (*self.blocks, Block(self.reserved, 0)):
            if block.offset > cursor:
                gaps.append((cursor, block.offset))
            cursor = block.end
        return gaps

    def close(self) -> None:
        """Unmap and release every block, then the address range."""
        for block, _ in list(self._handles.values()):
            self._unmap(block)
        if self.base:
            self._vm.free_range(self.base, self.reserved)
            self.base = 0

    def __del__(self) -> None:  # the last tensor over it is gone
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class VmmBacking:
    """Allocates large buffers as VmmAllocations and finds them again by address."""

    def __init__(self, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 memory: Callable[[torch.device], VirtualMemory] = cuda_virtual_memory) -> None:
        self.chunk_bytes = chunk_bytes
        self._memory = memory
        self._allocations: list[weakref.ref[VmmAllocation]] = []

    def __call__(self, nbytes: int, device: torch.device) -> torch.Tensor:
        allocation = VmmAllocation(nbytes, device, chunk_bytes=self.chunk_bytes, memory=self._memory(device))
        self._allocations.append(weakref.ref(allocation))
        return allocation.view(0, nbytes, owner=allocation)

    @property
    def allocations(self) -> tuple[VmmAllocation, ...]:
        live = [a for a in (r() for r in self._allocations) if a is not None]
        return tuple(live)

    def mapped_bytes(self, flat: torch.Tensor) -> int:
        """Bytes mapped now of the allocation holding `flat` (an arena's storage: ArenaBacking)."""
        return self.allocation_at(flat.data_ptr()).mapped_bytes

    def allocation_at(self, address: int) -> VmmAllocation:
        """The allocation holding `address` (a tensor's data_ptr)."""
        for a in self.allocations:
            if a.base <= address < a.base + a.reserved:
                return a
        raise KeyError(f"address {address:#x} is not in any VMM allocation of this backing")

    @property
    def granularity(self) -> int:
        found = self.allocations
        return found[0].granularity if found else 2 << 20
