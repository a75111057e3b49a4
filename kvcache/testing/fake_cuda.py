"""FakeCudaReadings: the torch.cuda calls the GPU benchmarks make, answered on the CPU from a simulated card.

The GPU benchmarks (benchmarks/gpu_*.py) read memory through torch.cuda (mem_get_info, memory_allocated,
the caching allocator's reserved bytes) and synchronize around their timings. To run their functions in CI
(tests/test_benchmark_smoke.py) on the CPU or the meta device, `installed()` puts these answers in torch.cuda's
place for the duration: a card of `total_bytes` with `free_bytes` free, nothing allocated or reserved, and
housekeeping calls counted. Only the calls listed in CALLS are stood in for; anything else still fails as it does
without a GPU, so a benchmark reaching for more is seen.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

CALLS = ("mem_get_info", "memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
         "synchronize", "empty_cache", "get_device_name", "init", "is_available")


class FakeCudaReadings:
    """A simulated card's readings in torch.cuda's shape; `calls` counts what was asked."""

    def __init__(self, *, total_bytes: int, free_bytes: int, name: str = "simulated card (kvcache.testing)") -> None:
        if not 0 <= free_bytes <= total_bytes:
            raise ValueError(f"free bytes {free_bytes:,} must lie within the card's {total_bytes:,}")
        self.total_bytes, self.free_bytes, self.name = total_bytes, free_bytes, name
        self.calls: Counter[str] = Counter()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self.calls["mem_get_info"] += 1
        return self.free_bytes, self.total_bytes

    def memory_allocated(self, device: Any = None) -> int:
        self.calls["memory_allocated"] += 1
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        self.calls["memory_reserved"] += 1
        return 0

    def max_memory_reserved(self, device: Any = None) -> int:
        self.calls["max_memory_reserved"] += 1
        return 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.calls["reset_peak_memory_stats"] += 1

    def synchronize(self, device: Any = None) -> None:
        self.calls["synchronize"] += 1

    def empty_cache(self) -> None:
        self.calls["empty_cache"] += 1

    def get_device_name(self, device: Any = None) -> str:
        self.calls["get_device_name"] += 1
        return self.name

    def init(self) -> None:
        self.calls["init"] += 1

    def is_available(self) -> bool:
        self.calls["is_available"] += 1
        return False  # no CUDA tensors can be made: the benchmark runs on its CPU or meta device

    @contextlib.contextmanager
    def installed(self) -> Iterator["FakeCudaReadings"]:
        """torch.cuda's CALLS answered by this card until the block ends (then torch's own again)."""
        saved = {name: getattr(torch.cuda, name) for name in CALLS}
        try:
            for name in CALLS:
                setattr(torch.cuda, name, getattr(self, name))
            yield self
        finally:
            for name, call in saved.items():
                setattr(torch.cuda, name, call)
