"""CUDA's virtual-memory driver calls (cuda-bindings), as the VirtualMemory that kvcache.memory.vmm_storage uses.

Needs `cuda-bindings` (the optional `cuda` extra); it is imported only when a CUDA pool
is built on VMM storage, never on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.errors import VmmError, VmmOutOfMemoryError

CUDA_ERROR_OUT_OF_MEMORY = 2  # CUresult


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
        refused = VmmOutOfMemoryError if int(err) == CUDA_ERROR_OUT_OF_MEMORY else VmmError
        raise refused(f"{call} failed: {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class _Span:
    """A raw device range presented as __cuda_array_interface__, so torch.as_tensor wraps it without copying."""

    def __init__(self, address: int, nbytes: int, owner: Any = None) -> None:
        self.owner = owner  # keeps the allocation alive as long as a tensor over it lives
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


class CudaVirtualMemory:
    """cuMemAddressReserve / cuMemCreate / cuMemMap and their inverses for one device, read-write access."""

    def __init__(self, device: torch.device) -> None:
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

    def granularity(self) -> int:
        return int(_check(self._d.cuMemGetAllocationGranularity(
            self._prop, self._d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity"))

    def reserve(self, nbytes: int, alignment: int) -> int:
        return int(_check(self._d.cuMemAddressReserve(nbytes, alignment, 0, 0), "cuMemAddressReserve"))

    def free_range(self, address: int, nbytes: int) -> None:
        _check(self._d.cuMemAddressFree(self._d.CUdeviceptr(address), nbytes), "cuMemAddressFree")

    def create(self, nbytes: int) -> Any:
        return _check(self._d.cuMemCreate(nbytes, self._prop, 0), "cuMemCreate")

    def map(self, address: int, nbytes: int, handle: Any) -> None:
        """Map `handle` at `address` with read-write access (unmapped again if access cannot be set)."""
        pointer = self._d.CUdeviceptr(address)
        _check(self._d.cuMemMap(pointer, nbytes, 0, handle, 0), "cuMemMap")
        try:
            _check(self._d.cuMemSetAccess(pointer, nbytes, [self._access], 1), "cuMemSetAccess")
        except BaseException:
            self._d.cuMemUnmap(pointer, nbytes)
            raise

    def unmap(self, address: int, nbytes: int) -> None:
        _check(self._d.cuMemUnmap(self._d.CUdeviceptr(address), nbytes), "cuMemUnmap")

    def release(self, handle: Any) -> None:
        _check(self._d.cuMemRelease(handle), "cuMemRelease")

    def tensor(self, address: int, nbytes: int, owner: Any) -> torch.Tensor:
        return torch.as_tensor(_Span(address, nbytes, owner), device=self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)
