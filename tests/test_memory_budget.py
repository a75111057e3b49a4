"""The KV budget: the exact formula, kv_cache_memory, and SGLang's derived mem_fraction_static."""

from __future__ import annotations

from fractions import Fraction

import pytest

from kvcache.byte_units import GiB, MiB
from kvcache.errors import DoesNotFitError, KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError
from kvcache.memory_budget import (
    compute_budget, default_chunked_prefill_size, default_cuda_graph_max_bs, derive_mem_fraction_static,
    exact_fraction, runtime_reserve_mib,
)


def budget(free_before: int, free_after: int, fraction: float | None = None, kv: int | None = None,
           total: int | None = None):  # type: ignore[no-untyped-def]
    return compute_budget(total_bytes=total or free_before, free_before_load=free_before, free_after_load=free_after,
                          mem_fraction_static=fraction, kv_cache_memory=kv)


@pytest.mark.parametrize(
    ("value", "fraction"),
    [(0.88, Fraction(22, 25)), (0.9, Fraction(9, 10)), (0.836, Fraction(209, 250)), (0.5, Fraction(1, 2))],
)
def test_exact_fraction_reads_the_decimal_as_written(value: float, fraction: Fraction) -> None:
    assert exact_fraction(value) == fraction
    assert Fraction(value) != fraction or value == 0.5  # the binary float is not the decimal


@pytest.mark.parametrize(
    ("free_before", "free_after", "fraction", "expected", "naive"),
    [
        # 80 GiB free before, 20 GiB after: keep round(80 GiB x 1/10) = 8 GiB free -> 12 GiB
        (80 * GiB, 20 * GiB, 0.9, 20 * GiB - 8 * GiB, None),
        # a tie: 85,899,345,935 x 1/10 = 8,589,934,593.5 exactly; round() takes the even neighbour
        # 8,589,934,594. In floats 1 - 0.9 = 0.09999999999999998, the product is 8,589,934,593.499998
        # and rounds to ...593: one byte more budget than the formula gives.
        (80 * GiB + 15, 20 * GiB, 0.9, 20 * GiB - 8_589_934_594, 20 * GiB - 8_589_934_593),
        # 0.85: 85,899,345,950 x 3/20 = 12,884,901,892.5 -> even 12,884,901,892; floats give
        # 12,884,901,892.500002 -> ...893
        (80 * GiB + 30, 30 * GiB, 0.85, 30 * GiB - 12_884_901_892, 30 * GiB - 12_884_901_893),
        # 10^10 x 1/10 = 10^9 exactly; floats give 999,999,999.9999998, which int() would truncate
        (10**10, 5 * 10**9, 0.9, 5 * 10**9 - 10**9, None),
    ],
)
def test_budget_formula_is_exact(free_before: int, free_after: int, fraction: float, expected: int,
                                 naive: int | None) -> None:
    b = budget(free_before, free_after, fraction)
    assert b.budget_bytes == expected
    assert b.budget_bytes == free_after - round(free_before * (1 - Fraction(repr(fraction))))
    if naive is not None:  # the float formula really would differ here
        assert free_after - round(free_before * (1 - fraction)) == naive != expected
    assert b.weights_and_load_bytes == free_before - free_after
    assert (b.mem_fraction_static, b.kv_cache_memory_bytes) == (fraction, None)


def test_kv_cache_memory_is_the_budget_when_it_fits() -> None:
    b = budget(80 * GiB, 20 * GiB, kv=5 * GiB, total=81 * GiB)
    assert (b.budget_bytes, b.total_bytes, b.kv_cache_memory_bytes, b.mem_fraction_static) == (5 * GiB, 81 * GiB, 5 * GiB, None)
    assert budget(80 * GiB, 20 * GiB, kv=20 * GiB).budget_bytes == 20 * GiB  # all of what is free is allowed


def test_kv_cache_memory_above_what_is_free_is_refused_with_numbers() -> None:
    with pytest.raises(KVCacheMemoryTooLargeError, match=r"--kv-cache-memory asks for 20\.00 GiB .* only 8\.00 GiB "
                                                         r"\(8,589,934,592 B\) is free after loading weights") as info:
        budget(24 * GiB, 8 * GiB, kv=20 * GiB)
    err = info.value
    assert (err.needed_bytes, err.available_bytes) == (20 * GiB, 8 * GiB)
    assert isinstance(err, DoesNotFitError)
    assert "21,474,836,480 B" in str(err)


@pytest.mark.parametrize(
    ("free_before", "free_after", "fraction", "keep_free"),
    [
        # 100 GiB x (1 - 0.5) = 50 GiB kept free, 50 GiB left after loading: budget 0
        (100 * GiB, 50 * GiB, 0.5, 50 * GiB),
        # 80 GiB x 0.164 = 13.12 GiB kept, 12 GiB left: negative
        (80 * GiB, 12 * GiB, 0.836, round(80 * GiB * Fraction(164, 1000))),
    ],
)
def test_weights_that_leave_no_room(free_before: int, free_after: int, fraction: float, keep_free: int) -> None:
    with pytest.raises(WeightsLeaveNoRoomError, match=f"nothing is left for the KV cache at --mem-fraction-static {fraction}") as info:
        budget(free_before, free_after, fraction)
    assert (info.value.needed_bytes, info.value.available_bytes) == (keep_free, free_after)


def test_one_byte_of_budget_is_a_budget() -> None:
    # keep round(100 x 1/2) = 50; 51 free after: budget 1
    assert budget(100, 51, 0.5).budget_bytes == 1


# ---- SGLang's card-size defaults --------------------------------------------------------

@pytest.mark.parametrize(
    ("mib", "chunked"),
    [(16 * 1024, 2048), (35 * 1024 - 1, 2048), (35 * 1024, 4096), (60 * 1024 - 1, 4096), (60 * 1024, 8192),
     (81920, 8192), (160 * 1024 - 1, 8192), (160 * 1024, 16384), (196592, 16384)],
)
def test_default_chunked_prefill_size(mib: int, chunked: int) -> None:
    assert default_chunked_prefill_size(mib * MiB) == chunked


@pytest.mark.parametrize(
    ("mib", "tp", "bs"),
    [(16 * 1024, 1, 8), (24576, 1, 24), (24576, 4, 80), (40960, 2, 32), (40960, 8, 160),
     (81920, 1, 256), (81920, 4, 512), (143771, 1, 256), (183359, 1, 512)],
)
def test_default_cuda_graph_max_bs(mib: int, tp: int, bs: int) -> None:
    assert default_cuda_graph_max_bs(mib * MiB, tp) == bs


def reserve(mib: int, *, chunked: int | None = None, bs: int | None = None, tp: int = 1, pp: int = 1, dp: int = 1,
            spec: str = "none") -> Fraction:
    total = mib * MiB
    return runtime_reserve_mib(
        total_bytes=total, chunked_prefill_size=chunked if chunked is not None else default_chunked_prefill_size(total),
        cuda_graph_max_bs=bs if bs is not None else default_cuda_graph_max_bs(total, tp), tp_size=tp, pp_size=pp,
        dp_attention_size=dp, speculative_algorithm=spec,
    )


@pytest.mark.parametrize(
    ("mib", "kwargs", "reserve_mib", "fraction"),
    [
        # 80 GiB (81,920 MiB): chunked 8,192, graphs 256:
        # 512 + 1.5 x 8,192 + 2 x 256 + 1 x 1 / 8 x 1,024 = 13,440; round(68,480 / 81,920, 3) = round(0.8359375) = 0.836
        (81920, {}, 13440, 0.836),
        # H200 as nvidia-smi shows it, 143,771 MiB: the same 13,440; 130,331 / 143,771 = 0.90652 -> 0.907
        (143771, {}, 13440, 0.907),
        # a 24 GiB card: chunked 2,048, graphs 24: 512 + 3,072 + 48 + 128 = 3,760; 20,816 / 24,576 = 0.84701 -> 0.847
        (24576, {}, 3760, 0.847),
        # a 40 GiB card: chunked 4,096, graphs 32: 512 + 6,144 + 64 + 128 = 6,848; 34,112 / 40,960 = 0.83281 -> 0.833
        (40960, {}, 6848, 0.833),
        # TP8 on 80 GiB: graphs 512 (tp >= 4): 512 + 12,288 + 1,024 + 8 / 8 x 1,024 = 14,848; 67,072 / 81,920 = 0.81875 -> 0.819
        (81920, {"tp": 8}, 14848, 0.819),
        # TP2 x PP2: 512 + 12,288 + 512 + 4 / 8 x 1,024 = 13,824; 68,096 / 81,920 = 0.83125 -> 0.831
        (81920, {"tp": 2, "pp": 2}, 13824, 0.831),
        # the 10 GiB floor above 60 GiB: 512 + 1.5 x 2,048 + 2 x 8 + 128 = 3,728 -> 10,240; 71,680 / 81,920 = 0.875
        (81920, {"chunked": 2048, "bs": 8}, 10240, 0.875),
        # exactly 60 GiB is not above it: 3,728 stays; 57,712 / 61,440 = 0.93932 -> 0.939
        (61440, {"chunked": 2048, "bs": 8}, 3728, 0.939),
        # one MiB above 60 GiB: the floor applies; 51,201 / 61,441 = 0.83334 -> 0.833
        (61441, {"chunked": 2048, "bs": 8}, 10240, 0.833),
        # chunked prefill below 2,048 counts as 2,048
        (40960, {"chunked": 512, "bs": 32}, 512 + 3072 + 64 + 128, 0.908),
        # speculative: a draft model adds 2 GiB, STANDALONE 6 GiB, after the floor
        (81920, {"spec": "EAGLE"}, 13440 + 2048, 0.811),  # 66,432 / 81,920 = 0.81094
        (81920, {"spec": "NEXTN"}, 13440 + 2048, 0.811),
        (81920, {"spec": "STANDALONE"}, 13440 + 6144, 0.761),  # 62,336 / 81,920 = 0.76094
        (81920, {"chunked": 2048, "bs": 8, "spec": "EAGLE3"}, 10240 + 2048, 0.85),  # 69,632 / 81,920 = 0.85
        # DP attention (TP8, DP8): 14,848 + 3 x 512 x 8 = 12,288, and bs 512 > 300 adds 1.5 x 512 x 8 = 6,144:
        # 33,280; 48,640 / 81,920 = 0.59375 -> 0.594
        (81920, {"tp": 8, "dp": 8}, 33280, 0.594),
        # bs 256 (<= 300): only 3 x 256 x 4 = 3,072 on top of 512 + 12,288 + 512 + 1,024 = 14,336 -> 17,408
        # 64,512 / 81,920 = 0.7875 -> 0.788 (0.7875 is exact; rounding half to even gives 0.788)
        (81920, {"tp": 8, "dp": 4, "bs": 256}, 17408, 0.788),
    ],
)
def test_derived_mem_fraction_static(mib: int, kwargs: dict, reserve_mib: int, fraction: float) -> None:
    r = reserve(mib, **kwargs)
    assert r == reserve_mib
    assert derive_mem_fraction_static(mib * MiB, r) == fraction


def test_derived_fraction_is_rounded_in_exact_arithmetic() -> None:
    # 81,920 MiB card, reserve 13,440 MiB: 68,480 / 81,920 = 107 / 128 = 0.8359375 exactly
    assert Fraction(81920 - 13440, 81920) == Fraction(107, 128)
    # a card that is not a whole number of MiB (150,109,880,320 B = 143,155.9375 MiB, an H200 as
    # cudaMemGetInfo reports it): (143,155.9375 - 13,440) / 143,155.9375 = 0.906116 -> 0.906
    assert derive_mem_fraction_static(150_109_880_320, Fraction(13440)) == 0.906


@pytest.mark.parametrize(("mib", "reserve_mib"), [(4096, 13440), (8192, 8000), (1024, 1024)])
def test_derived_fraction_is_at_least_five_percent(mib: int, reserve_mib: int) -> None:
    # a reserve at or above the card would give <= 0: SGLang's floor of 0.05 applies
    assert derive_mem_fraction_static(mib * MiB, Fraction(reserve_mib)) == 0.05
