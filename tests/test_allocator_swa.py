"""SWATokenToKVPoolAllocator: both sides move together, the map follows, free_swa frees one side."""

from __future__ import annotations

import pytest
import torch

from kvcache.allocators import SWATokenToKVPoolAllocator
from kvcache.sizing.allocator_footprint import allocator_index_bytes
from sglang_calls import decode, extend
from kvcache.sizing.arena_sizes import allocation_size
from kvcache.testing.allocator_plans import swa_allocator


def make(full: int = 16, swa: int = 8, page_size: int = 1, check_frees: bool = True) -> SWATokenToKVPoolAllocator:
    return swa_allocator(full_size=full, swa_size=swa, page_size=page_size, device="cpu",
                                     check_frees=check_frees)


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def mapped(a: SWATokenToKVPoolAllocator) -> dict[int, int]:
    table = a.full_to_swa_index_mapping
    assert int(table[-1]) == -1  # SGLang's extra row: last_loc -1 translates to -1
    rows = torch.nonzero(table[:-1]).reshape(-1)
    return dict(zip(rows.tolist(), table[rows].tolist()))


def test_alloc_takes_from_both_sides_and_maps_full_to_swa() -> None:
    a = make(16, 8)
    full = a.alloc(3)
    assert full is not None and full.tolist() == [1, 2, 3]
    assert a.translate_loc_from_full_to_swa(full).tolist() == [1, 2, 3]
    assert (a.full_available_size(), a.swa_available_size(), a.available_size()) == (13, 5, 5)
    assert mapped(a) == {1: 1, 2: 2, 3: 3}
    assert a.full_to_swa_index_mapping.shape == (18,) and a.full_to_swa_index_mapping.dtype == torch.int64


def test_alloc_beyond_either_side_returns_none_and_changes_nothing() -> None:
    a = make(16, 4)
    assert a.alloc(5) is None  # the full side has room, the SWA side does not
    assert (a.full_available_size(), a.swa_available_size()) == (16, 4)
    assert mapped(a) == {}


def test_free_releases_both_sides_and_unmaps() -> None:
    a = make(16, 8)
    full = a.alloc(4)
    assert full is not None
    a.free(full[:2])
    assert (a.full_available_size(), a.swa_available_size()) == (14, 6)
    assert mapped(a) == {3: 3, 4: 4}


def test_free_swa_releases_only_the_window_side_and_free_does_not_repeat_it() -> None:
    a = make(16, 8)
    full = a.alloc(4)
    assert full is not None
    a.free_swa(full[:3])
    assert (a.full_available_size(), a.swa_available_size()) == (12, 7)
    assert mapped(a) == {4: 4}
    a.free_swa(full[:3])  # already out of the window: nothing left to free
    a.free(full)  # check_frees would raise on a second SWA free
    assert (a.full_available_size(), a.swa_available_size()) == (16, 8)


def test_sliding_window_lets_the_full_side_outgrow_the_swa_pool() -> None:
    a = make(16, 4)
    held = []
    for _ in range(12):  # a request decodes 12 tokens, keeping a window of the last 3
        chunk = a.alloc(1)
        assert chunk is not None
        held.append(chunk)
        a.free_swa(torch.cat(held)[:-3])
    assert a.full_available_size() == 4 and a.swa_available_size() == 1


def test_free_group_defers_both_sides() -> None:
    a = make(16, 8)
    full = a.alloc(4)
    assert full is not None
    a.free_group_begin()
    a.free(full[:2])
    a.free_swa(full[2:3])  # window frees wait for the group's end too
    assert (a.full_available_size(), a.swa_available_size()) == (12, 4)
    a.free_group_end()
    assert (a.full_available_size(), a.swa_available_size()) == (14, 7)
    assert mapped(a) == {4: 4}


def test_clear_resets_both_sides_and_the_map() -> None:
    a = make(16, 8)
    a.alloc(6)
    a.clear()
    assert (a.full_available_size(), a.swa_available_size()) == (16, 8)
    assert mapped(a) == {}


def test_restore_brings_back_free_sets_and_map() -> None:
    a = make(16, 8)
    held = a.alloc(4)
    assert held is not None
    state = a.backup_state()
    a.free_swa(held[:2])
    a.free(held[2:3])
    a.alloc(3)
    a.restore_state(state)
    assert (a.full_available_size(), a.swa_available_size()) == (12, 4)
    assert mapped(a) == {1: 1, 2: 2, 3: 3, 4: 4}
    a.free(held)  # every side held again: no double free
    assert (a.full_available_size(), a.swa_available_size()) == (16, 8)


def test_only_the_latest_backup_restores() -> None:
    a = make()
    old = a.backup_state()
    a.backup_state()
    with pytest.raises(ValueError, match="not the latest backup"):
        a.restore_state(old)
    state = a.backup_state()
    a.clear()
    with pytest.raises(ValueError, match="clear"):
        a.restore_state(state)


def test_paged_extend_and_decode_keep_pages_aligned_on_both_sides() -> None:
    a = make(32, 16, page_size=4)  # full pages 1..8, SWA pages 1..4
    a.alloc(4)  # full page 1 and SWA page 1 go to a request that is not in this batch
    full = extend(a, t(0, 0), t(6, 3), t(-1, -1), 9)
    assert full is not None and full.tolist() == [8, 9, 10, 11, 12, 13, 16, 17, 18]
    swa = a.translate_loc_from_full_to_swa(full)
    assert swa.tolist() == [8, 9, 10, 11, 12, 13, 16, 17, 18]
    assert (full % 4).tolist() == (swa % 4).tolist()
    out = decode(a, t(7, 4), t(13, 18))
    assert out is not None and out.tolist() == [14, 19]
    assert a.translate_loc_from_full_to_swa(out).tolist() == [14, 19]
    out = decode(a, t(9, 5), t(15, 19))  # both requests start a page: 2 new pages each side
    assert out is None  # the full side has 4 pages left, the SWA side none
    assert (a.full_available_size(), a.swa_available_size()) == (16, 0)


def test_paged_free_swa_works_on_whole_pages() -> None:
    a = make(32, 16, page_size=4)
    full = extend(a, t(0), t(10), t(-1), 10)  # full pages 1, 2, 3 and SWA pages 1, 2, 3
    assert full is not None
    a.free_swa(full[:5])  # tokens 4..8 touch pages 1 and 2: both leave the window
    assert a.swa_available_size() == 12
    assert set(mapped(a)) == {12, 13}
    out = extend(a, t(10), t(12), t(13), 2)  # continues SWA page 3
    assert out is not None and a.translate_loc_from_full_to_swa(out).tolist() == [14, 15]
    a.free(full)
    assert (a.full_available_size(), a.swa_available_size()) == (32, 16)
    assert mapped(a) == {}


@pytest.mark.parametrize("check_frees", [True, False])
def test_paged_free_group_frees_a_full_page_touched_by_two_frees_once(check_frees: bool) -> None:
    a = make(32, 16, page_size=4, check_frees=check_frees)
    full = extend(a, t(0), t(8), t(-1), 8)  # full pages 1, 2 and SWA pages 1, 2
    assert full is not None
    a.free_group_begin()
    a.free(full[:2])  # both calls touch full page 1 (as SGLang's free group, the page is freed once)
    a.free(full[2:4])
    a.free_group_end()
    assert (a.full_available_size(), a.swa_available_size()) == (28, 12)
    assert sorted(a.full_attn_allocator.get_all_free_pages().tolist()) == [1, 3, 4, 5, 6, 7, 8]
    assert set(mapped(a)) == {8, 9, 10, 11}


def test_extend_into_a_page_that_left_the_window_is_caught_when_checking() -> None:
    a = make(32, 16, page_size=4)
    full = extend(a, t(0), t(3), t(-1), 3)
    assert full is not None
    a.free_swa(full)
    with pytest.raises(ValueError, match="full index 6 continues a partial page but has no SWA slot"):
        extend(a, t(3), t(4), t(6), 1)


def test_alloc_extend_and_decode_need_pages() -> None:
    a = make(16, 8, page_size=1)
    with pytest.raises(ValueError, match="alloc_extend\\(\\) needs page_size > 1"):
        extend(a, t(0), t(2), t(-1), 2)
    with pytest.raises(ValueError, match="alloc_decode\\(\\) needs page_size > 1"):
        decode(a, t(1), t(-1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"full_size": 30, "swa_size": 16, "page_size": 4}, "full_size 30 must be a positive multiple of page_size 4"),
        ({"full_size": 32, "swa_size": 10, "page_size": 4}, "swa_size 10 must be a positive multiple of page_size 4"),
        ({"full_size": 32, "swa_size": 0, "page_size": 1}, "swa_size 0 must be a positive multiple of page_size 1"),
        ({"full_size": 32, "swa_size": 16, "page_size": 0}, "page_size must be >= 1, got 0"),
    ],
)
def test_bad_sizes_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        swa_allocator(device="cpu", **kwargs)


def test_checked_free_of_unheld_full_indices_raises_and_changes_nothing() -> None:
    a = make(16, 8)
    a.alloc(2)
    with pytest.raises(ValueError, match="double free: token index 5 is already free"):
        a.free(t(5))
    with pytest.raises(ValueError, match="token index 0"):
        a.free(t(0))
    assert (a.full_available_size(), a.swa_available_size()) == (14, 6)


@pytest.mark.parametrize("page_size", [1, 16])
def test_properties_and_nbytes_match_the_planner(page_size: int) -> None:
    a = swa_allocator(full_size=4096, swa_size=1024, page_size=page_size, device="cpu")
    assert (a.size, a.size_full, a.size_swa, a.page_size) == (1024, 4096, 1024, page_size)  # size: both sides (SGLang)
    assert a.nbytes == allocator_index_bytes(4096, page_size, 1024)


def test_meta_allocator_constructs_but_holds_no_indices() -> None:
    a = swa_allocator(full_size=1 << 20, swa_size=1 << 16, page_size=16, device="meta")
    assert a.available_size() == 1 << 16 and a.full_to_swa_index_mapping.device.type == "meta"
    a.restore_state(a.backup_state())
    with pytest.raises(ValueError, match="meta-device allocator"):
        a.alloc(16)
    with pytest.raises(ValueError, match="meta-device allocator"):
        a.free_swa(t(16))


def test_restore_after_a_long_live_backup_still_restores_the_map() -> None:
    # Enough map writes after the backup that the journal outgrows the map and is folded.
    a = make(8, 8)
    alloced = a.alloc(2)
    assert alloced is not None
    held = alloced.clone()  # 60 frees follow: far past the capacity a view of the free log is kept for
    state = a.backup_state()
    for _ in range(20):
        extra = a.alloc(5)
        assert extra is not None
        a.free_swa(extra[:2])
        a.free(extra)
    a.free(held[:1])
    a.restore_state(state)
    assert mapped(a) == {1: 1, 2: 2}
    assert (a.full_available_size(), a.swa_available_size()) == (6, 6)
    a.restore_state(state)  # a restored backup stays restorable
    assert mapped(a) == {1: 1, 2: 2}


def test_checked_allocators_count_their_flags_in_nbytes() -> None:
    a = swa_allocator(full_size=64, swa_size=32, page_size=4, device="cpu", check_frees=True)
    # Each buffer at the device allocator's 512 B blocks: two free logs each of 2 x 16 and of 2 x 8 page
    # starts, 17 + 9 flags, 69 map rows (64 tokens, a padding page of 4, the -1 row): 8 blocks.
    expected = sum(allocation_size(n) for n in (32 * 8, 32 * 8, 17, 16 * 8, 16 * 8, 9, 69 * 8))
    assert a.nbytes == allocator_index_bytes(64, 4, 32, check_frees=True) == expected == 8 * 512


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("fails", ["swa side", "map write"])
def test_a_step_whose_second_half_fails_gives_both_sides_back(mocker, page_size: int, fails: str) -> None:
    """A device OOM after the full side took its pages (in the SWA side's take, or the map write) changes no free list."""
    a = make(64, 32, page_size=page_size, check_frees=False)
    before = (a.full_available_size(), a.swa_available_size())
    if fails == "swa side":
        mocker.patch.object(a.swa_attn_allocator, "_on_new_pages" if page_size > 1 else "alloc",
                            side_effect=RuntimeError("CUDA out of memory (injected)"))
    else:
        mocker.patch.object(a._map, "write", side_effect=RuntimeError("CUDA out of memory (injected)"))
    with pytest.raises(RuntimeError, match="injected"):
        a.alloc(2 * page_size)
    if page_size > 1:
        with pytest.raises(RuntimeError, match="injected"):
            decode(a, t(5, 9), t(7, 11))  # both requests start a page
        with pytest.raises(RuntimeError, match="injected"):
            extend(a, t(0, 0), t(6, 9), t(-1, -1), 15)
    assert (a.full_available_size(), a.swa_available_size()) == before
    mocker.stopall()
    full = a.alloc(before[1])  # every SWA slot still handed out exactly once
    assert full is not None and a.swa_available_size() == 0 and len(set(full.tolist())) == before[1]
