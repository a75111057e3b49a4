"""TokenToKVPoolAllocator: indices 1..size, free groups, clear, backup/restore, misuse, devices."""

from __future__ import annotations

import pytest
import torch

from kvcache.allocators import TokenToKVPoolAllocator
from kvcache.sizing.allocator_footprint import allocator_index_bytes, free_log_slots
from kvcache.byte_units import MiB
from kvcache.errors import PlanMismatchError
from kvcache.memory.device_buffers import Arena
from kvcache.pools.planned_views import carve_slots
from kvcache.testing.allocator_plans import token_allocator

CPU = torch.device("cpu")


def make(size: int = 8, check_frees: bool = True) -> TokenToKVPoolAllocator:
    return token_allocator(size=size, device=torch.device("cpu"), check_frees=check_frees)


def held_after_drain(a: TokenToKVPoolAllocator) -> set[int]:
    """Allocate everything free and return it (the allocator's free set, seen from outside)."""
    out = a.alloc(a.available_size())
    assert out is not None
    return set(out.tolist())


def test_fresh_allocator_hands_out_1_to_size_and_never_0() -> None:
    a = make(8)
    out = a.alloc(8)
    assert out is not None and out.dtype == torch.int64 and out.device.type == "cpu"
    assert out.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert a.available_size() == 0
    assert a.alloc(1) is None


def test_alloc_beyond_available_returns_none_and_changes_nothing() -> None:
    a = make(8)
    first = a.alloc(5)
    assert a.alloc(4) is None
    assert a.available_size() == 3
    assert held_after_drain(a) == {6, 7, 8}
    assert first is not None


def test_alloc_zero_is_an_empty_tensor() -> None:
    out = make(4).alloc(0)
    assert out is not None and out.numel() == 0 and out.dtype == torch.int64


def test_freed_indices_come_back_after_the_ones_already_free() -> None:
    a = make(8)
    out = a.alloc(6)
    assert out is not None
    a.free(out[1:3])
    assert a.available_size() == 4
    again = a.alloc(4)  # the free log is first-in, first-out: 7, 8, then the freed 2, 3
    assert again is not None and again.tolist() == [7, 8, 2, 3]


def test_free_of_an_empty_tensor_is_a_no_op() -> None:
    a = make(4)
    a.free(torch.empty(0, dtype=torch.int64))
    assert a.available_size() == 4


def test_free_accepts_int32_and_two_dimensional_indices() -> None:
    a = make(8)
    out = a.alloc(4)
    assert out is not None
    a.free(out.to(torch.int32).reshape(2, 2))
    assert a.available_size() == 8


def test_alloc_result_is_not_overwritten_by_later_frees() -> None:
    a = make(8)
    x = a.alloc(3)
    y = a.alloc(3)
    assert x is not None and y is not None
    snapshot = x.clone()
    a.free(y)
    a.free(torch.tensor([1]))
    # 4 + 4 x 2 = 12 frees after x was handed out, past the guarantee of capacity (8) frees: the log
    # (16 entries, tail 12 now) fills on the 3rd cycle and moves to the other log, never over x
    for _ in range(4):
        z = a.alloc(2)
        assert z is not None
        a.free(z)
    assert torch.equal(x, snapshot)


def test_free_group_defers_release_until_end() -> None:
    a = make(8)
    out = a.alloc(6)
    assert out is not None
    a.free_group_begin()
    a.free(out[:2])
    a.free(out[2:4])
    assert a.available_size() == 2
    a.free_group_end()
    assert a.available_size() == 6


def test_free_group_nesting_and_unmatched_end_are_errors() -> None:
    a = make(4)
    with pytest.raises(ValueError, match="free_group_end"):
        a.free_group_end()
    a.free_group_begin()
    a.free(torch.tensor([1]))
    with pytest.raises(ValueError, match="1 frees pending"):
        a.free_group_begin()


def test_clear_frees_everything_and_closes_the_group() -> None:
    a = make(8)
    out = a.alloc(7)
    assert out is not None
    a.free_group_begin()
    a.free(out[:3])
    a.clear()
    assert a.available_size() == 8
    a.free_group_begin()  # the old group is gone, so this is not nesting
    a.free_group_end()
    assert held_after_drain(a) == set(range(1, 9))


def test_restore_undoes_allocs_and_frees_since_backup() -> None:
    a = make(10)
    held = a.alloc(4)
    assert held is not None
    state = a.backup_state()
    a.alloc(3)
    a.free(held[:2])
    a.alloc(5)
    a.restore_state(state)
    assert a.available_size() == 6
    assert held_after_drain(a) == set(range(5, 11))


def test_restore_can_repeat_and_state_is_frozen() -> None:
    a = make(6)
    state = a.backup_state()
    with pytest.raises(AttributeError):
        state.free_list = None  # type: ignore[misc]
    for _ in range(3):
        assert a.alloc(4) is not None
        a.restore_state(state)
        assert a.available_size() == 6


def test_restore_keeps_double_free_checks_consistent() -> None:
    a = make(6)
    out = a.alloc(2)
    assert out is not None
    state = a.backup_state()
    a.free(out)
    late = a.alloc(5)
    assert late is not None
    a.restore_state(state)
    a.free(out)  # held again after restore, so this is not a double free
    with pytest.raises(ValueError, match="already free"):
        a.free(out[:1])


def test_restore_inside_a_free_group_brings_back_the_pending_frees() -> None:
    a = make(8)
    out = a.alloc(6)
    assert out is not None
    a.free_group_begin()
    a.free(out[:2])
    state = a.backup_state()
    a.free(out[2:4])
    a.free_group_end()
    a.restore_state(state)
    assert a.available_size() == 2
    a.free_group_end()  # the group is open again, holding the first two
    assert a.available_size() == 4


def test_restore_outside_a_group_closes_one_opened_later() -> None:
    a = make(4)
    out = a.alloc(2)
    assert out is not None
    state = a.backup_state()
    a.free_group_begin()
    a.free(out)
    a.restore_state(state)
    with pytest.raises(ValueError, match="without an open free group"):
        a.free_group_end()
    assert a.available_size() == 2


def test_only_the_latest_backup_restores() -> None:
    a = make(4)
    old = a.backup_state()
    a.backup_state()
    with pytest.raises(ValueError, match="not the latest backup"):
        a.restore_state(old)
    latest = a.backup_state()
    a.clear()
    with pytest.raises(ValueError, match="clear"):
        a.restore_state(latest)


def test_state_of_another_allocator_is_rejected() -> None:
    a, b = make(4), make(4)
    b.backup_state()
    with pytest.raises(ValueError, match="not the latest backup"):
        b.restore_state(a.backup_state())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([0], "token index 0: it is the padding"),
        ([9], "token index 9: out of range 1..8"),
        ([-2], "token index -2: out of range 1..8"),
        ([3, 3], "token index 3 is freed twice"),
        ([7], "double free: token index 7 is already free"),
    ],
)
def test_checked_free_rejects_bad_indices_and_changes_nothing(bad: list[int], message: str) -> None:
    a = make(8)
    a.alloc(4)
    with pytest.raises(ValueError, match=message):
        a.free(torch.tensor(bad))
    assert a.available_size() == 4


def test_checked_free_catches_duplicates_across_one_free_group() -> None:
    a = make(8)
    out = a.alloc(4)
    assert out is not None
    a.free_group_begin()
    a.free(out[:2])
    a.free(out[1:3])
    with pytest.raises(ValueError, match="token index 2 is freed twice"):
        a.free_group_end()


def test_unchecked_free_still_refuses_to_overflow_the_free_list() -> None:
    a = make(4, check_frees=False)
    a.alloc(1)
    with pytest.raises(ValueError, match=r"freeing 2 ids \(token index\) but only 1 are allocated"):
        a.free(torch.tensor([1, 2]))


@pytest.mark.parametrize(("size", "message"), [(0, "size 0 must be a positive multiple of page_size 1"),
                                               (-5, "size -5 must be")])
def test_bad_sizes_are_rejected(size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_allocator(size=size)


@pytest.mark.parametrize(("slots", "given"), [
    (free_log_slots(0), "allocator.free_log.0 (0,) int64; allocator.free_log.1 (0,) int64"),  # no id at all
    (free_log_slots(8)[:1], "allocator.free_log.0 (16,) int64"),  # one log
    ((*free_log_slots(8)[:1], *free_log_slots(4)[1:]), "allocator.free_log.0 (16,) int64; allocator.free_log.1 (8,) int64"),
    ((*free_log_slots(8), *free_log_slots(4, True)[2:]),  # flags for 4 ids beside logs for 8
     "allocator.free_log.0 (16,) int64; allocator.free_log.1 (16,) int64; allocator.is_free (5,) bool"),
], ids=["empty", "one-log", "logs-differ", "flags-differ"])
def test_slots_that_are_not_a_planned_free_list_are_refused_naming_what_was_given(slots: tuple, given: str) -> None:
    """The allocator reads its size from its planned slots, so it checks they are one free list's: two int64 logs
    of two entries per id (one id at least) and, to check frees, one bool per id and the padding id."""
    with pytest.raises(PlanMismatchError) as refused:
        TokenToKVPoolAllocator(slots=slots, device=CPU)
    assert str(refused.value).endswith(f"each in a slot; given {given}")


def test_bad_alloc_and_free_arguments_are_rejected() -> None:
    a = make(4)
    with pytest.raises(ValueError, match="need_size must be >= 0, got -1"):
        a.alloc(-1)
    with pytest.raises(ValueError, match="integer tensor, got dtype torch.float32"):
        a.free(torch.tensor([1.0]))


def test_constructor_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        TokenToKVPoolAllocator(free_log_slots(8), "cpu")  # type: ignore[misc]


def test_properties_and_nbytes_match_the_planner() -> None:
    a = token_allocator(size=100, device="cpu")
    assert (a.size, a.page_size, a.device) == (100, 1, torch.device("cpu"))
    assert a.nbytes == allocator_index_bytes(100, 1) == 4096  # two logs of 200 x int64 = 1,600 B, each four 512 B blocks
    assert make(100).nbytes == allocator_index_bytes(100, 1, check_frees=True)


def test_meta_allocator_constructs_but_holds_no_indices() -> None:
    a = token_allocator(size=1 << 20, device="meta")
    assert a.available_size() == 1 << 20 and a.device.type == "meta"
    assert a.nbytes == allocator_index_bytes(1 << 20, 1)
    a.restore_state(a.backup_state())
    a.free(torch.empty(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="meta-device allocator.*no real"):
        a.alloc(4)
    with pytest.raises(ValueError, match="meta-device allocator"):
        a.free(torch.tensor([1]))
    with pytest.raises(ValueError, match="meta-device allocator"):
        a.free(torch.empty(3, dtype=torch.int64, device="meta"))  # not through the hot path either
    with pytest.raises(ValueError, match="check_frees=True needs real tensors"):
        token_allocator(size=8, device="meta", check_frees=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocator_keeps_indices_on_the_device() -> None:
    a = token_allocator(size=64, device="cuda", check_frees=True)
    out = a.alloc(8)
    assert out is not None and out.device.type == "cuda" and out.dtype == torch.int64
    state = a.backup_state()
    a.free(out)
    a.restore_state(state)
    assert a.available_size() == 56


def _held_tensors(obj: object, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from obj's attributes through kvcache objects (the allocator's live buffers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _held_tensors(item, seen)]
    if not type(obj).__module__.startswith("kvcache."):
        return []
    names = [*getattr(obj, "__dict__", {})] + [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())]
    return [t for n in names if hasattr(obj, n) for t in _held_tensors(getattr(obj, n), seen)]


@pytest.mark.parametrize("check_frees", [False, True])
def test_compactions_allocate_nothing_beyond_the_plan_and_lose_no_index(check_frees: bool) -> None:
    # 100 tokens: two logs of 200 int64 = 1,600 B, each a 2,048 B slot (plus 101 flags in a 512 B slot when
    # checking). 30 held, 60 cycles of alloc 7 / free 7 free 420 ids: log A (head 30, tail 100) fills after 14
    # cycles, then 3 compactions in all, each into the other log.
    planned = allocator_index_bytes(100, 1, check_frees=check_frees)
    assert planned == 2 * 2_048 + (512 if check_frees else 0)
    arena = Arena(10 * MiB, CPU)
    views = carve_slots(arena, free_log_slots(100, check_frees))
    a = token_allocator(size=100, device=CPU, check_frees=check_frees, views=views)
    held = a.alloc(30)
    assert held is not None
    held = held.clone()
    for step in range(60):
        out = a.alloc(7)
        assert out is not None
        a.free(out.flip(0) if step % 2 else out)
    arena_storage = next(iter(views.values())).untyped_storage().data_ptr()
    assert {t.untyped_storage().data_ptr() for t in _held_tensors(a)} == {arena_storage}  # nothing of its own
    assert a.nbytes == planned == arena.used
    rest = a.alloc(a.available_size())
    assert rest is not None
    assert sorted([*held.tolist(), *rest.tolist()]) == list(range(1, 101))  # every index once


def test_a_restore_across_two_compactions_gives_back_the_backed_up_free_set() -> None:
    a = token_allocator(size=8, device=CPU)
    held = a.alloc(3)
    assert held is not None
    state = a.backup_state()
    for _ in range(30):  # 30 frees: log A (16 entries) fills, its ids move to B, B fills and they move back over A
        a.free(a.alloc(1))
    a.restore_state(state)
    assert a.available_size() == 5 and held_after_drain(a) == {4, 5, 6, 7, 8}
    a.restore_state(state)  # still restorable
    assert held_after_drain(a) == {4, 5, 6, 7, 8}
    assert a.nbytes == allocator_index_bytes(8, 1)
