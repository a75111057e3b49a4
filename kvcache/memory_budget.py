"""The KV budget: bytes the cache may take, from the probe's numbers and ServerArgs.

budget = free_after_load - round(free_before_load * (1 - mem_fraction_static)),
or `kv_cache_memory` when given (checked against what is free after the weights).
When mem_fraction_static is not given it is derived from the card's size the way
SGLang does (see `derive_mem_fraction_static`).
"""

from __future__ import annotations

from fractions import Fraction

import msgspec

from kvcache.byte_units import MiB, format_bytes
from kvcache.errors import KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError


class MemoryBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The budget and the numbers it came from (all bytes)."""

    budget_bytes: int
    total_bytes: int
    free_before_load_bytes: int
    free_after_load_bytes: int
    mem_fraction_static: float | None
    kv_cache_memory_bytes: int | None

    @property
    def weights_and_load_bytes(self) -> int:
        """What loading took (weights, plus anything else allocated in between)."""
        return self.free_before_load_bytes - self.free_after_load_bytes


def exact_fraction(x: float) -> Fraction:
    """0.88 -> 22/25: a decimal knob as the exact ratio a person meant, not its binary float."""
    return Fraction(repr(x))




def default_chunked_prefill_size(total_bytes: int) -> int:
    """SGLang's default by card size: 2k below 35 GiB, 4k below 60 GiB, 8k below 160 GiB, else 16k."""
    mib = total_bytes // MiB
    if mib < 35 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 160 * 1024:
        return 8192
    return 16384


def default_cuda_graph_max_bs(total_bytes: int, tp_size: int) -> int:
    """SGLang's default CUDA-graph batch cap by card size and TP."""
    mib = total_bytes // MiB
    small_tp = tp_size < 4
    if mib < 20 * 1024:
        return 8
    if mib < 35 * 1024:
        return 24 if small_tp else 80
    if mib < 60 * 1024:
        return 32 if small_tp else 160
    if mib < 160 * 1024:
        return 256 if small_tp else 512
    return 512


def runtime_reserve_mib(
    *, total_bytes: int, chunked_prefill_size: int, cuda_graph_max_bs: int, tp_size: int, pp_size: int,
    dp_attention_size: int, speculative_algorithm: str,
) -> Fraction:
    """SGLang's reserve for activations, CUDA graphs and metadata, in MiB (exact).

    512 + 1.5 * max(chunked_prefill, 2048) + 2 * cuda_graph_max_bs + tp * pp / 8 * 1024,
    plus 3 * bs * dp (and 1.5 * bs * dp above bs 300) for DP attention; at least 10 GiB
    on cards above 60 GiB; plus 6 GiB for STANDALONE or 2 GiB for other draft models.
    """
    reserve = Fraction(512) + Fraction(3, 2) * max(chunked_prefill_size, 2048) + 2 * cuda_graph_max_bs
    reserve += Fraction(tp_size * pp_size, 8) * 1024
    if dp_attention_size > 1:
        reserve += 3 * cuda_graph_max_bs * dp_attention_size
        if cuda_graph_max_bs > 300:
            reserve += Fraction(3, 2) * cuda_graph_max_bs * dp_attention_size
    if total_bytes // MiB > 60 * 1024:
        reserve = max(reserve, Fraction(10 * 1024))
    if speculative_algorithm == "STANDALONE":
        reserve += 6 * 1024
    elif speculative_algorithm != "none":
        reserve += 2 * 1024
    return reserve


def derive_mem_fraction_static(total_bytes: int, reserve_mib: Fraction) -> float:
    """round((card - reserve) / card, 3), in MiB as SGLang computes it; at least 0.05."""
    card_mib = Fraction(total_bytes, MiB)
    value = round((card_mib - reserve_mib) / card_mib, 3)
    return float(max(Fraction(1, 20), value))


def compute_budget(
    *, total_bytes: int, free_before_load: int, free_after_load: int,
    mem_fraction_static: float | None, kv_cache_memory: int | None,
) -> MemoryBudget:
    """The KV budget in bytes; raises when the weights leave nothing or kv_cache_memory exceeds what is free."""
    if kv_cache_memory is not None:
        if kv_cache_memory > free_after_load:
            raise KVCacheMemoryTooLargeError(
                f"--kv-cache-memory asks for {format_bytes(kv_cache_memory)}, but only "
                f"{format_bytes(free_after_load)} is free after loading weights",
                needed_bytes=kv_cache_memory, available_bytes=free_after_load,
            )
        budget = kv_cache_memory
    else:
        assert mem_fraction_static is not None
        keep_free = round(free_before_load * (1 - exact_fraction(mem_fraction_static)))
        budget = free_after_load - keep_free
        if budget <= 0:
            raise WeightsLeaveNoRoomError(
                f"after loading weights ({format_bytes(free_before_load - free_after_load)}) nothing is left for the "
                f"KV cache at --mem-fraction-static {mem_fraction_static}: the runtime keeps "
                f"{format_bytes(keep_free)} free",
                needed_bytes=keep_free, available_bytes=free_after_load,
            )
    return MemoryBudget(
        budget_bytes=budget, total_bytes=total_bytes, free_before_load_bytes=free_before_load,
        free_after_load_bytes=free_after_load, mem_fraction_static=mem_fraction_static,
        kv_cache_memory_bytes=kv_cache_memory,
    )
