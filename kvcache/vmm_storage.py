"""KV storage on CUDA's virtual-memory API: fixed addresses whose physical backing can be given back in part.

A `VmmAllocation` reserves one address range (cuMemAddressReserve) and maps physical
blocks into it (cuMemCreate + cuMemMap, one handle per block, so a block can be
unmapped alone). Tensors over it keep their addresses for life, so CUDA graphs
captured against the pools stay valid after `keep_only` unmaps everything outside the
byte ranges still needed (kvcache.runtime.tail_release decides which blocks).
`VmmBacking` is the allocation function `kvcache.device_buffers.cuda_backing` takes.

Needs `cuda-bindings` (the optional `cuda` extra); it is imported only when a CUDA pool
is built this way, never on the CPU.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

from kvcache.runtime.tail_release import Block, chunk_blocks, plan_tail_release

DEFAULT_CHUNK_BYTES = 64 << 20  # handles per GiB stay few; boundary chunks are remapped finer at release


class VmmError(RuntimeError):
    """A CUDA driver virtual-memory call failed (out of memory, or VMM unsupported)."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - CUDA only
        raise VmmError("resizable KV pools need the cuda-bindings package: pip install 'kvcache-configurator[cuda]'") from exc
    return driver


def _check(result: Any, call: str) -> Any:
    """Unpack a cuda-bindings result tuple; raise VmmError on a driver error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise VmmError(f"{call} failed: {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class _Span:
    """A raw device range presented as __cuda_array_interface__, so torch.as_tensor wraps it without copying."""

    def __init__(self, address: int, nbytes: int, owner: Any = None) -> None:
        self.owner = owner  # keeps the allocation alive as long as a tensor over it lives
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


class VmmAllocation:
    """One reserved address range on one device, mapped in blocks; `tensor` is a uint8 view of it all."""

    def __init__(self, nbytes: int, device: torch.device, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self._d = d = _driver()
        self.device = device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._prop = d.CUmemAllocationProp()
        self._prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self._prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._prop.location.id = index
        self._access = d.CUmemAccessDesc()
        self._access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._access.location.id = index
        self._access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.granularity = int(_check(d.cuMemGetAllocationGranularity(
            self._prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"))
        chunk = max(self.granularity, chunk_bytes // self.granularity * self.granularity)
        self.nbytes = nbytes
        blocks = chunk_blocks(nbytes, chunk, self.granularity)
        self.reserved = sum(b.size for b in blocks)
        self.base = int(_check(d.cuMemAddressReserve(self.reserved, self.granularity, 0, 0), "cuMemAddressReserve"))
        self._handles: dict[int, Any] = {}  # block offset -> (block, handle)
        try:
            for block in blocks:
                self._map(block)
        except BaseException:
            self.close()
            raise

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(sorted((b for b, _ in self._handles.values()), key=lambda b: b.offset))

    @property
    def mapped_bytes(self) -> int:
        return sum(b.size for b, _ in self._handles.values())

    def _map(self, block: Block) -> None:
        d = self._d
        handle = _check(d.cuMemCreate(block.size, self._prop, 0), "cuMemCreate")
        address = d.CUdeviceptr(self.base + block.offset)
        try:
            _check(d.cuMemMap(address, block.size, 0, handle, 0), "cuMemMap")
        except BaseException:
            d.cuMemRelease(handle)
            raise
        self._handles[block.offset] = (block, handle)
        _check(d.cuMemSetAccess(address, block.size, [self._access], 1), "cuMemSetAccess")

    def _unmap(self, block: Block) -> None:
        _, handle = self._handles.pop(block.offset)
        _check(self._d.cuMemUnmap(self._d.CUdeviceptr(self.base + block.offset), block.size), "cuMemUnmap")
        _check(self._d.cuMemRelease(handle), "cuMemRelease")

    def view(self, offset: int, nbytes: int, owner: Any = None) -> torch.Tensor:
        """uint8 [nbytes] at base + offset (owner: what the tensor keeps alive)."""
        return torch.as_tensor(_Span(self.base + offset, nbytes, owner), device=self.device)

    def keep_only(self, ranges: Sequence[tuple[int, int]]) -> int:
        """Unmap everything outside `ranges` ([start, end) offsets), keeping their bytes; returns bytes released."""
        torch.cuda.synchronize(self.device)
        before = self.mapped_bytes
        plan = plan_tail_release(self.blocks, ranges, self.granularity)
        for block in plan.dropped:
            self._unmap(block)
        for old, parts in plan.remapped:
            saved = [(p, self.view(p.offset, p.size).clone()) for p in parts]
            torch.cuda.synchronize(self.device)
            self._unmap(old)
            for part, data in saved:
                self._map(part)
                self.view(part.offset, part.size).copy_(data)
            del saved
        torch.cuda.synchronize(self.device)
        return before - self.mapped_bytes

    def close(self) -> None:
        """Unmap and release every block, then the address range."""
        for block, _ in list(self._handles.values()):
            self._unmap(block)
        if getattr(self, "base", 0):
            self._d.cuMemAddressFree(self._d.CUdeviceptr(self.base), self.reserved)
            self.base = 0

    def __del__(self) -> None:  # the last tensor over it is gone
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class VmmBacking:
    """Allocates large CUDA buffers as VmmAllocations and finds them again by address."""

    def __init__(self, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._allocations: list[weakref.ref[VmmAllocation]] = []

    def __call__(self, nbytes: int, device: torch.device) -> torch.Tensor:
        allocation = VmmAllocation(nbytes, device, chunk_bytes=self.chunk_bytes)
        self._allocations.append(weakref.ref(allocation))
        return allocation.view(0, nbytes, owner=allocation)

    @property
    def allocations(self) -> tuple[VmmAllocation, ...]:
        live = [a for a in (r() for r in self._allocations) if a is not None]
        return tuple(live)

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
