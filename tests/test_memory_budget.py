"""The KV budget: the exact formula, kv_cache_memory, and how a derived mem_fraction_static is rounded."""

from __future__ import annotations

from fractions import Fraction

import pytest

from kvcache.byte_units import GiB, MiB
from kvcache.errors import DoesNotFitError, KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError
from kvcache.arithmetic import exact_fraction
from kvcache.sizing.memory_budget import compute_budget, derive_mem_fraction_static


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


# ---- the derived fraction's rounding (the reserve itself: test_runtime_reserve.py) ------------------

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
