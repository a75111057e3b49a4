"""FakeVirtualMemory: the driver calls of kvcache.memory.vmm_storage on the CPU, strict as the driver is.

An address range is a CPU byte buffer; a physical handle is a buffer of its own. Mapping
copies the handle's bytes into the range, unmapping copies them back (a handle keeps its
bytes until released, as physical memory does) and fills the range with POISON, so a
test reads exactly what the driver would leave mapped. Physical memory is limited to
`capacity_bytes`, and `fail(call, after=n)` makes the call fail once after n successes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.errors import VmmError, VmmOutOfMemoryError

POISON = 0xA5


@dataclass(eq=False)
class FakeHandle:
    """Physical memory: its bytes, and whether it is mapped."""

    data: torch.Tensor
    mapped_at: int | None = None


class FakeVirtualMemory:
    """Reserve, create, map, unmap, release over CPU buffers; counts physical bytes in use."""

    def __init__(self, *, granularity: int = 4096, capacity_bytes: int = 1 << 30) -> None:
        self._granularity = granularity
        self.capacity_bytes = capacity_bytes
        self.physical_bytes = 0
        self._ranges: dict[int, torch.Tensor] = {}  # reserved base address -> its bytes
        self._mappings: dict[int, tuple[int, FakeHandle]] = {}  # mapped address -> (size, handle)
        self._failures: dict[str, int] = {}

    def fail(self, call: str, *, after: int = 0) -> None:
        """Make the next `call` ('create', 'map', ...) after `after` successful ones raise VmmError, once."""
        self._failures[call] = after

    def _maybe_fail(self, call: str) -> None:
        left = self._failures.get(call)
        if left is None:
            return
        if left == 0:
            del self._failures[call]
            raise VmmError(f"{call} failed (injected)")
        self._failures[call] = left - 1

    def _range_of(self, address: int, nbytes: int) -> tuple[torch.Tensor, int]:
        for base, buffer in self._ranges.items():
            if base <= address and address + nbytes <= base + buffer.numel():
                return buffer, address - base
        raise VmmError(f"[{address:#x}, +{nbytes}) is not inside a reserved range")

    def _aligned(self, *values: int) -> None:
        if any(v % self._granularity for v in values):
            raise VmmError(f"{values} not aligned to the {self._granularity}-byte granularity")

    # ---- VirtualMemory ---------------------------------------------------
    def granularity(self) -> int:
        return self._granularity

    def reserve(self, nbytes: int, alignment: int) -> int:
        self._maybe_fail("reserve")
        self._aligned(nbytes)
        buffer = torch.full((nbytes + alignment,), POISON, dtype=torch.uint8)
        skip = -buffer.data_ptr() % alignment
        buffer = buffer[skip:skip + nbytes]
        self._ranges[buffer.data_ptr()] = buffer
        return buffer.data_ptr()

    def free_range(self, address: int, nbytes: int) -> None:
        if any(address <= a < address + nbytes for a in self._mappings):
            raise VmmError("freeing an address range that is still mapped")
        del self._ranges[address]

    def create(self, nbytes: int) -> FakeHandle:
        self._maybe_fail("create")
        self._aligned(nbytes)
        if self.physical_bytes + nbytes > self.capacity_bytes:
            raise VmmOutOfMemoryError(f"cuMemCreate: out of memory ({nbytes} B asked, "
                           f"{self.capacity_bytes - self.physical_bytes} B free)")
        self.physical_bytes += nbytes
        return FakeHandle(data=torch.full((nbytes,), POISON, dtype=torch.uint8))

    def map(self, address: int, nbytes: int, handle: FakeHandle) -> None:
        self._maybe_fail("map")
        buffer, offset = self._range_of(address, nbytes)
        self._aligned(offset, nbytes)
        if handle.mapped_at is not None or nbytes != handle.data.numel():
            raise VmmError("a handle is mapped once, whole")
        if any(a < address + nbytes and address < a + size for a, (size, _) in self._mappings.items()):
            raise VmmError(f"[{address:#x}, +{nbytes}) overlaps a mapping")
        buffer[offset:offset + nbytes].copy_(handle.data)
        handle.mapped_at = address
        self._mappings[address] = (nbytes, handle)

    def unmap(self, address: int, nbytes: int) -> None:
        self._maybe_fail("unmap")
        size, handle = self._mappings.get(address, (None, None))
        if size != nbytes or handle is None:
            raise VmmError(f"[{address:#x}, +{nbytes}) is not one mapping")
        buffer, offset = self._range_of(address, nbytes)
        handle.data.copy_(buffer[offset:offset + nbytes])
        buffer[offset:offset + nbytes] = POISON
        handle.mapped_at = None
        del self._mappings[address]

    def release(self, handle: FakeHandle) -> None:
        if handle.mapped_at is not None:
            raise VmmError("releasing a handle that is still mapped")
        self.physical_bytes -= handle.data.numel()
        handle.data = torch.empty(0, dtype=torch.uint8)

    def tensor(self, address: int, nbytes: int, owner: Any) -> torch.Tensor:
        buffer, offset = self._range_of(address, nbytes)
        view = buffer[offset:offset + nbytes]
        view.owner = owner  # type: ignore[attr-defined]  # as the CUDA span keeps its allocation alive
        return view

    def synchronize(self) -> None:
        pass
