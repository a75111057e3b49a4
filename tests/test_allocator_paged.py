"""PagedTokenToKVPoolAllocator: whole pages, page 0 never, alloc_extend / alloc_decode worked by hand."""

from __future__ import annotations

import random

import pytest
import torch

from kvcache.allocators import PagedTokenToKVPoolAllocator
from kvcache.sizing.allocator_footprint import allocator_index_bytes
from kvcache.testing.allocator_plans import paged_allocator
from sglang_calls import decode, extend


def make(size: int = 32, page_size: int = 4, check_frees: bool = True) -> PagedTokenToKVPoolAllocator:
    return paged_allocator(size=size, page_size=page_size, device=torch.device("cpu"), check_frees=check_frees)


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def free_pages(a: PagedTokenToKVPoolAllocator) -> set[int]:
    """Allocate every free page and return their numbers (the free set, seen from outside)."""
    out = a.alloc(a.available_size())
    assert out is not None
    return set((out // a.page_size).tolist())


def test_pages_are_1_to_n_and_page_0_is_never_handed_out() -> None:
    a = make(32, 4)  # pages 1..8, tokens 4..35
    out = a.alloc(32)
    assert out is not None
    assert out.tolist() == list(range(4, 36))
    assert a.alloc(4) is None and a.num_pages == 8


def test_alloc_beyond_available_returns_none_and_changes_nothing() -> None:
    a = make(16, 4)
    a.alloc(8)
    assert a.alloc(12) is None
    assert a.available_size() == 8
    assert free_pages(a) == {3, 4}


def test_free_frees_the_pages_its_indices_belong_to() -> None:
    a = make(16, 4)
    out = a.alloc(16)
    assert out is not None
    a.free(t(9, 8, 9, 14))  # tokens of pages 2 and 3, one repeated, out of order
    assert a.available_size() == 8
    assert free_pages(a) == {2, 3}


def test_free_group_collects_tokens_of_one_page_from_several_calls() -> None:
    a = make(16, 4)
    out = a.alloc(8)
    assert out is not None
    a.free_group_begin()
    a.free(out[:2])
    a.free(out[2:6])  # page 1 again, and page 2
    assert a.available_size() == 8
    a.free_group_end()
    assert a.available_size() == 16


def test_alloc_extend_worked_example() -> None:
    # page_size 4; request 0 holds page 1 (tokens 4..7) with positions 0..2 at 4, 5, 6.
    a = make(32, 4)
    assert a.alloc(4) is not None
    prefix, seq, last = t(3, 0), t(6, 5), t(6, -1)
    # request 0: position 3 continues page 1 -> 7; positions 4, 5 take page 2 -> 8, 9.
    # request 1: positions 0..4 take pages 3 and 4 -> 12, 13, 14, 15, 16.
    out = extend(a, prefix, seq, last, 8, num_new_pages=3)
    assert out is not None and out.tolist() == [7, 8, 9, 12, 13, 14, 15, 16]
    assert a.available_size() == 32 - 16


def test_alloc_decode_worked_example() -> None:
    a = make(32, 4)
    a.alloc(4)
    extend(a, t(3, 0), t(6, 5), t(6, -1), 8)  # as above: pages 1..4 held
    # request 0: position 6 is offset 2 of page 2 -> 9 + 1; request 1: position 5 is
    # offset 1 of page 4 -> 16 + 1; a new request 2 at position 0 takes page 5 -> 20.
    out = decode(a, t(7, 6, 1), t(9, 16, -1))
    assert out is not None and out.tolist() == [10, 17, 20]
    out = decode(a, t(8, 7, 2, 5), t(10, 17, 20, 16))  # one starting page 6 at position 4
    assert out is not None and out.tolist() == [11, 18, 21, 24]


def test_alloc_extend_with_page_aligned_prefix_and_zero_length_request() -> None:
    a = make(32, 4)
    a.alloc(4)  # request 0 holds page 1 full (positions 0..3 at 4..7)
    out = extend(a, t(4, 2), t(5, 2), t(7, 99), 1)  # request 1 extends by nothing
    assert out is not None and out.tolist() == [8]


def test_alloc_extend_without_room_returns_none_and_changes_nothing() -> None:
    a = make(16, 4)
    a.alloc(8)
    assert extend(a, t(0, 0), t(5, 4), t(-1, -1), 9) is None  # needs 3 pages, 2 free
    assert a.available_size() == 8
    assert decode(a, t(1, 1, 1), t(-1, -1, -1)) is None
    assert free_pages(a) == {3, 4}


def test_alloc_extend_validates_before_allocating() -> None:
    a = make(16, 4)
    with pytest.raises(ValueError, match="extend_num_tokens is 7 but sum\\(seq_lens - prefix_lens\\) is 8"):
        extend(a, t(3, 0), t(6, 5), t(6, -1), 7)
    with pytest.raises(ValueError, match="seq_lens - prefix_lens = -2"):
        extend(a, t(5), t(3), t(6), -2)
    with pytest.raises(ValueError, match="prefix_lens has 2 requests but seq_lens has 1"):
        extend(a, t(0, 0), t(3), t(-1, -1), 3)
    with pytest.raises(ValueError, match="last_loc has 1 entries for 2 requests"):
        extend(a, t(0, 0), t(3, 1), t(-1), 4)
    with pytest.raises(ValueError, match="seq_lens must be >= 1 .*got 0"):
        decode(a, t(0), t(3))
    with pytest.raises(ValueError, match="num_new_pages is 2 but the lengths need 3"):
        extend(a, t(3, 0), t(6, 5), t(6, -1), 8, num_new_pages=2)
    assert a.available_size() == 16


def test_empty_batches_allocate_nothing() -> None:
    a = make(16, 4)
    out = extend(a, t(), t(), t(), 0)
    assert out is not None and out.numel() == 0
    out = decode(a, t(), t())
    assert out is not None and out.numel() == 0
    assert a.available_size() == 16


def test_backup_restore_undoes_extend_and_decode() -> None:
    a = make(32, 4)
    held = a.alloc(8)
    assert held is not None
    state = a.backup_state()
    extend(a, t(0), t(9), t(-1), 9)
    decode(a, t(1, 1), t(-1, -1))
    a.free(held[:4])
    a.restore_state(state)
    assert a.available_size() == 24
    assert free_pages(a) == set(range(3, 9))


def test_clear_makes_every_page_free() -> None:
    a = make(16, 4)
    a.alloc(12)
    a.clear()
    assert free_pages(a) == {1, 2, 3, 4}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ((0, 1), "cannot free page 0: it is the padding page"),
        ((36,), "cannot free page 9: out of range 1..8"),
        ((28,), "double free: page 7 is already free"),
    ],
)
def test_checked_free_rejects_bad_pages_and_changes_nothing(bad: tuple[int, ...], message: str) -> None:
    a = make(32, 4)
    a.alloc(8)
    with pytest.raises(ValueError, match=message):
        a.free(t(*bad))
    assert a.available_size() == 24


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 30, "page_size": 4}, "size 30 must be a positive multiple of page_size 4"),
        ({"size": 0, "page_size": 16}, "size 0 must be a positive multiple of page_size 16"),
        ({"size": 2, "page_size": 4}, "size 2 must be a positive multiple of page_size 4"),
        ({"size": 16, "page_size": 0}, "page_size must be >= 1, got 0"),
    ],
)
def test_bad_sizes_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paged_allocator(device="cpu", **kwargs)


def test_alloc_needs_a_multiple_of_page_size() -> None:
    with pytest.raises(ValueError, match="need_size 6 is not a multiple of page_size 4"):
        make(16, 4).alloc(6)


def test_properties_and_nbytes_match_the_planner() -> None:
    a = paged_allocator(size=4096, page_size=16, device="cpu")
    assert (a.size, a.page_size, a.num_pages, a.device) == (4096, 16, 256, torch.device("cpu"))
    assert a.nbytes == allocator_index_bytes(4096, 16) == 2 * 2 * 256 * 8  # two logs of 512 int64 = 2 x 4,096 B


def test_meta_allocator_constructs_but_holds_no_indices() -> None:
    a = paged_allocator(size=1 << 24, page_size=64, device="meta")
    assert a.available_size() == 1 << 24
    with pytest.raises(ValueError, match="alloc_extend\\(\\) on a meta-device allocator"):
        extend(a, t(0), t(3), t(-1), 3)
    with pytest.raises(ValueError, match="alloc\\(\\) on a meta-device allocator"):
        a.alloc(64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_extend_and_decode_match_cpu() -> None:
    results = []
    for device in ("cpu", "cuda"):
        a = paged_allocator(size=64, page_size=4, device=device, check_frees=True)
        a.alloc(4)
        ext = extend(a, t(3, 0), t(6, 5), t(6, -1), 8)
        dec = decode(a, t(7, 6), t(9, 16))
        assert ext is not None and dec is not None and ext.device.type == device
        results.append((ext.tolist(), dec.tolist()))
    assert results[0] == results[1]


class _KernelsThatFail:
    """A kernel launch that fails (as a Triton compile error or a device OOM would) after pages were taken."""

    def alloc_decode(self, *args: object) -> None:
        raise RuntimeError("launch failed (injected)")

    alloc_extend = alloc_decode


def test_a_step_that_fails_after_taking_pages_gives_them_back() -> None:
    a = paged_allocator(size=1024, page_size=16, device="cpu", kernels=_KernelsThatFail())  # type: ignore[arg-type]
    free = a.available_size()
    seq = torch.tensor([17, 18, 33])  # two requests start a page
    with pytest.raises(RuntimeError, match="injected"):
        a.alloc_decode(seq, seq, torch.tensor([15, 40, 63]))
    prefix, new = torch.tensor([0, 8]), torch.tensor([40, 20])
    with pytest.raises(RuntimeError, match="injected"):
        a.alloc_extend(prefix, prefix, new, new, torch.tensor([-1, 7]), 52)
    assert a.available_size() == free
    assert a.alloc(free) is not None and a.available_size() == 0  # every page still handed out once


@pytest.mark.parametrize("ps", [2, 16, 64])
def test_small_batch_runs_equal_the_per_token_plan(mocker, ps: int) -> None:
    """The two host paths of alloc_extend (runs for small batches, the per-token plan for larger) agree index for index."""
    rng = random.Random(ps)
    for _ in range(30):
        n = rng.randint(1, 12)
        prefix = torch.tensor([rng.choice([0, rng.randint(0, 3 * ps)]) for _ in range(n)])
        new = prefix + torch.tensor([rng.choice([0, 1, ps - 1, ps, rng.randint(0, 4 * ps)]) for _ in range(n)])
        results = []
        for small in (64, -1):
            mocker.patch("kvcache.allocators.paged.SMALL_BATCH", small)
            a = paged_allocator(size=256 * ps, page_size=ps, device="cpu", check_frees=True)
            held = a.alloc(64 * ps)  # the requests' earlier pages: request i's partial page is page i + 1
            assert held is not None
            last = torch.where(prefix > 0, held[::ps][: n] + (prefix - 1) % ps, torch.full_like(prefix, -1))
            results.append(extend(a, prefix, new, last, int((new - prefix).sum())).tolist())  # type: ignore[union-attr]
        assert results[0] == results[1]
