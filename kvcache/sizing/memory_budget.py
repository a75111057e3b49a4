"""The KV budget: bytes the cache may take, from the probe's numbers and ServerArgs.

budget = free_after_load - round(free_before_load * (1 - mem_fraction_static)) - reserved,
or `kv_cache_memory` when given (checked against what is free after the weights). `reserved` is what the
engine allocates only after sizing the KV cache (SGLang's multimodal embedding cache), so it is kept out.
When mem_fraction_static is not given it is derived from the card's size the way
SGLang does (`kvcache.sizing.runtime_reserve`, then `derive_mem_fraction_static`).
"""

from __future__ import annotations

from fractions import Fraction

import msgspec

from kvcache.byte_units import MiB, format_bytes
from kvcache.errors import KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError
from kvcache.arithmetic import exact_fraction


class MemoryBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The budget and the numbers it came from (all bytes)."""

    budget_bytes: int
    total_bytes: int
    free_before_load_bytes: int
    free_after_load_bytes: int
    mem_fraction_static: float | None
    kv_cache_memory_bytes: int | None
    reserved_bytes: int = 0  # kept out of the budget for buffers allocated after the KV cache is sized
    reported_total_bytes: int | None = None  # nvidia-smi's total where the card reports one apart from total_bytes

    @property
    def device_capacity_bytes(self) -> int:
        """The card as SGLang 0.5.23's get_device_memory_capacity reads it (nvidia-smi's), which its derived
        mem_fraction_static was computed for; total_bytes (cudaMemGetInfo's) where the card reports one total."""
        return self.total_bytes if self.reported_total_bytes is None else self.reported_total_bytes

    @property
    def weights_and_load_bytes(self) -> int:
        """What loading took (weights, plus anything else allocated in between)."""
        return self.free_before_load_bytes - self.free_after_load_bytes


MIN_DERIVED_FRACTION = Fraction(1, 20)  # our floor: SGLang's value goes to zero or below on a card no larger than the reserve


def derive_mem_fraction_static(total_bytes: int, reserve_mib: Fraction) -> float:
    """round((card - reserve) / card, 3), in MiB as SGLang computes it; at least MIN_DERIVED_FRACTION."""
    card_mib = Fraction(total_bytes, MiB)
    value = round((card_mib - reserve_mib) / card_mib, 3)
    return float(max(MIN_DERIVED_FRACTION, value))


def headroom_bytes(free_before_load: int, mem_fraction_static: float) -> int:
    """What a fraction keeps free: round(free_before_load * (1 - fraction)), the fraction read exactly."""
    return round(free_before_load * (1 - exact_fraction(mem_fraction_static)))


def compute_budget(
    *, total_bytes: int, free_before_load: int, free_after_load: int,
    mem_fraction_static: float | None, kv_cache_memory: int | None, reserved_bytes: int = 0,
    reported_total_bytes: int | None = None,
) -> MemoryBudget:
    """The KV budget in bytes; raises when the weights leave nothing or kv_cache_memory exceeds what is free."""
    if kv_cache_memory is not None:
        if kv_cache_memory > free_after_load:
            raise KVCacheMemoryTooLargeError(
                f"--kv-cache-memory asks for {format_bytes(kv_cache_memory)}, but only "
                f"{format_bytes(free_after_load)} is free after loading weights",
                needed_bytes=kv_cache_memory, available_bytes=free_after_load,
            )
        budget, reserved_bytes = kv_cache_memory, 0
    else:
        assert mem_fraction_static is not None
        keep_free = headroom_bytes(free_before_load, mem_fraction_static)
        budget = free_after_load - keep_free - reserved_bytes
        if budget <= 0:
            also = f" and {format_bytes(reserved_bytes)} for buffers allocated after it" if reserved_bytes else ""
            raise WeightsLeaveNoRoomError(
                f"after loading weights nothing is left for the KV cache at --mem-fraction-static "
                f"{mem_fraction_static}: free memory fell by {format_bytes(free_before_load - free_after_load)} "
                "while loading (the weights and what loading adds: CUDA kernels on a card) and the runtime keeps "
                f"{format_bytes(keep_free)} free{also}",
                needed_bytes=keep_free + reserved_bytes, available_bytes=free_after_load,
            )
    return MemoryBudget(
        budget_bytes=budget, total_bytes=total_bytes, free_before_load_bytes=free_before_load,
        free_after_load_bytes=free_after_load, mem_fraction_static=mem_fraction_static,
        kv_cache_memory_bytes=kv_cache_memory, reserved_bytes=reserved_bytes, reported_total_bytes=reported_total_bytes,
    )
