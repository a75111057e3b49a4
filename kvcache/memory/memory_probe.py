"""Memory probes: how many bytes a device has in all and has free right now.

`CudaMemoryProbe` asks the driver, `HostMemoryProbe` keeps a CPU engine inside a
configured limit (a host has no card to ask), and `FixedMemoryProbe` is a simulated
card for dry-run plans and tests. Probes that measure real memory ignore
`note_allocation`; the simulated one debits it, so a dry run on `meta` still sees
the weights it did not really allocate.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import torch

from kvcache.byte_units import MiB
from kvcache.inputs.cards import SimulatedCard
from kvcache.errors import ConfigError
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.inputs.host_memory import check_memory_limit, host_memory_bytes


@runtime_checkable
class MemoryProbe(Protocol):
    """What the configurator asks of a device's memory."""

    def free_bytes(self) -> int: ...

    def total_bytes(self) -> int: ...

    def device_capacity_bytes(self) -> int:
        """The card's total as its vendor tool reports it (nvidia-smi's memory.total): what SGLang 0.5.23's
        get_device_memory_capacity reads for its card-size defaults and derived mem_fraction_static."""
        ...

    def note_allocation(self, nbytes: int) -> None: ...


class CudaMemoryProbe:
    """A CUDA device, through cudaMemGetInfo after emptying the caching allocator."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ConfigError(f"CudaMemoryProbe needs a cuda device, got {device}")
        self._device = device

    def free_bytes(self) -> int:
        torch.cuda.synchronize(self._device)
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(self._device)
        return int(free)

    def total_bytes(self) -> int:
        return int(torch.cuda.mem_get_info(self._device)[1])

    def device_capacity_bytes(self) -> int:
        """The smallest card's total over every GPU NVML sees, in whole MiB: SGLang 0.5.23 reads nvidia-smi's
        memory.total of all of them and keeps the minimum. cudaMemGetInfo's where NVML cannot be read (SGLang falls
        back to torch.cuda.mem_get_info the same way)."""
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            totals = [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                      for i in range(pynvml.nvmlDeviceGetCount())]
            return min(totals) // MiB * MiB
        except Exception:  # noqa: BLE001 - no NVML (not installed, MIG, a container without it): cudaMemGetInfo's
            return self.total_bytes()

    def note_allocation(self, nbytes: int) -> None:
        """Real allocations show up in free_bytes by themselves."""


def _resident_bytes() -> int:
    """This process's resident set size, from /proc (0 where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class HostMemoryProbe:
    """A CPU engine's memory: a fixed limit, less what this process has grown by since the probe was made.

    Free is also capped by what the host really has available, so a limit larger
    than the machine cannot promise memory that is not there.
    """

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ConfigError(f"--memory-limit must be positive, got {limit_bytes}")
        self._limit = limit_bytes
        self._baseline = _resident_bytes()

    def free_bytes(self) -> int:
        used = max(0, _resident_bytes() - self._baseline)
        free = self._limit - used
        available = _host_available_bytes()
        return max(0, min(free, available) if available is not None else free)

    def total_bytes(self) -> int:
        return self._limit

    def device_capacity_bytes(self) -> int:
        """A host has one total: its limit."""
        return self._limit

    def note_allocation(self, nbytes: int) -> None:
        """Resident memory shows real allocations by itself."""


DEFAULT_HOST_MEMORY_LIMIT = 8 << 30


def probe_for_device(device: torch.device, *, memory_limit: int | None, card: "SimulatedCard | None") -> MemoryProbe:
    """CUDA asks the driver; cpu keeps within --memory-limit (8 GiB by default; a limit above what the host
    has is refused here, the one check every caller goes through); meta simulates `card`."""
    if device.type == "cuda":
        return CudaMemoryProbe(device)
    if device.type == "meta":
        if card is None:
            raise ConfigError("a dry run on the meta device needs a card to plan for: --gpu-memory 80GiB or --gpu H100-80GB")
        return FixedMemoryProbe.of_card(card)
    if memory_limit is not None:
        check_memory_limit(memory_limit, host_memory_bytes())
    return HostMemoryProbe(memory_limit or DEFAULT_HOST_MEMORY_LIMIT)
