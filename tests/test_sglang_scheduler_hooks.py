"""The capacity questions SGLang 0.5.23's scheduler asks every allocator and request table, answered by ours.

Numbers are worked by hand. The prefill budget is SGLang's own class: where the unpacked
reference tree is present, it is loaded from there and run over our allocators (skips otherwise).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from reference_sources import reference_src_holding

from kvcache.pools import ReqToTokenPool
from kvcache.sizing.pool_config import request_table_slot
from kvcache.testing.allocator_plans import paged_allocator, swa_allocator, token_allocator



class Tree:
    """A prefix cache holding some indices it frees when asked to evict (SGLang's evict_for_alloc)."""

    def __init__(self, allocator: Any, held: torch.Tensor) -> None:
        self.allocator, self.held, self.asked = allocator, held, []

    def supports_prefix_sharing(self) -> bool:
        return True

    def supports_mamba(self) -> bool:
        return False

    def evictable_size(self) -> int:
        return self.held.numel()

    def evict_for_alloc(self, params: Any) -> None:
        self.asked.append((params.num_tokens, params.swa_num_tokens))
        if self.held.numel():
            self.allocator.free(self.held)
            self.held = self.held[:0]


def test_max_new_tokens_is_clipped_to_an_empty_pool_after_the_page_rounded_prompt() -> None:
    a = paged_allocator(size=4096, page_size=16, device="cpu")
    clip = lambda prompt, wanted: a.max_new_tokens_for_memory(  # noqa: E731
        prompt, wanted, token_capacity=1000, sliding_window_size=None, chunk_size=None)
    assert clip(100, 2000) == 1000 - 112 - 16 - 1  # 100 tokens take 7 pages = 112
    assert clip(100, 50) == 50
    assert clip(990, 10) == 0  # the prompt alone fills it


@pytest.mark.parametrize("make", [
    lambda: token_allocator(size=64, device="cpu"),
    lambda: paged_allocator(size=64, page_size=4, device="cpu"),
])
def test_decode_capacity_evicts_the_shortfall_first(make: Any) -> None:
    a = make()
    held = a.alloc(60)
    tree = Tree(a, held[:40])
    assert a.check_decode_capacity(num_tokens=4, tree_cache=tree) and tree.asked == []  # 4 free already
    assert a.check_decode_capacity(num_tokens=20, tree_cache=tree) and tree.asked == [(16, 0)]
    assert a.available_size() == 44
    assert not a.check_decode_capacity(num_tokens=45, tree_cache=tree)  # nothing left to evict


def test_the_rest_of_the_scheduler_hooks_add_nothing_a_plain_pool_does_not_have() -> None:
    a = paged_allocator(size=64, page_size=4, device="cpu")
    assert a.request_slot_reserve(has_req_pool_slot=True, prefill_tokens=100) == 0
    assert a.prealloc_fits_assumes_reclaim() is False and a.prealloc_ceiling_fits(8, 0) is None
    assert a.prealloc_fits(None, 8, 4, full_budget_tokens=8, swa_budget_tokens=4)
    assert not a.prealloc_fits(None, 9, 0, full_budget_tokens=8)
    assert a.verify_byte_accounting() == [] and a.mamba_full_cache_donor() is None
    a.merge_and_sort_free()
    assert a.debug_print() == "#available-size: 64, "


def test_swa_reclaim_for_prealloc_evicts_the_window_side_and_names_a_shortfall() -> None:
    a = swa_allocator(full_size=64, swa_size=16, page_size=1, device="cpu")
    held = a.alloc(16)
    tree = Tree(a, held[:8])
    assert a.reclaim_for_prealloc(tree, 100, 8) is None and tree.asked == [(0, 8)]
    assert a.reclaim_for_prealloc(tree, 0, 9) == "the sliding-window side has 8 free tokens after eviction, 9 needed"
    assert a.swa_capacity_and_available(full_capacity=64, swa_capacity=16) == ((64, 56), (16, 8))


@pytest.mark.parametrize("page_size", [1, 4])
def test_resize_after_capture_shrinks_and_frees_everything_and_refuses_to_grow(page_size: int) -> None:
    a = (paged_allocator(size=64, page_size=page_size, device="cpu", check_frees=True) if page_size > 1
         else token_allocator(size=64, device="cpu", check_frees=True))
    a.alloc(8)
    a.resize(SimpleNamespace(max_total_num_tokens=32))
    assert a.size == a.available_size() == 32
    got = a.alloc(32)
    assert got is not None and int(got.max()) < 32 + page_size and a.alloc(page_size) is None
    with pytest.raises(ValueError, match="cannot be resized to"):
        a.resize(SimpleNamespace(max_total_num_tokens=128))
    swa = swa_allocator(full_size=64, swa_size=32, page_size=page_size, device="cpu")
    swa.alloc(page_size)
    swa.resize(SimpleNamespace(full_max_total_num_tokens=48, swa_max_total_num_tokens=16))
    assert (swa.size_full, swa.size_swa, swa.full_available_size(), swa.swa_available_size()) == (48, 16, 48, 16)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_refused_resize_changes_nothing(page_size: int) -> None:
    """SWA: the SWA side's refusal came after the full side had shrunk and freed everything (48 full tokens free,
    the 8 held ones void, the SWA side still holding them); a single pool: an open free group was dropped."""
    swa = swa_allocator(full_size=64, swa_size=32, page_size=page_size, device="cpu", check_frees=True)
    swa.alloc(8)
    with pytest.raises(ValueError, match="built for 32 tokens cannot be resized to 64"):
        swa.resize(SimpleNamespace(full_max_total_num_tokens=48, swa_max_total_num_tokens=64))
    assert (swa.size_full, swa.full_available_size(), swa.size_swa, swa.swa_available_size()) == (64, 56, 32, 24)
    one = (paged_allocator(size=64, page_size=page_size, device="cpu", check_frees=True) if page_size > 1
           else token_allocator(size=64, device="cpu", check_frees=True))
    held = one.alloc(8)
    one.free_group_begin()
    one.free(held)
    with pytest.raises(ValueError, match="built for 64 tokens cannot be resized to 128"):
        one.resize(SimpleNamespace(max_total_num_tokens=128))
    one.free_group_end()
    assert one.size == one.available_size() == 64


def test_request_table_answers_the_schedulers_table_hooks() -> None:
    pool = ReqToTokenPool(slot=request_table_slot(4, 8), device=torch.device("cpu"))
    seen: list[list[int]] = []
    pool.register_on_alloc_rows(seen.append)
    first = pool.alloc_rows(2)
    assert first is not None and seen == [first]
    pool.free_rows(first)
    pool.clear()
    again = pool.alloc_rows(4)
    assert again is not None
    assert sorted(pool.req_generation.tolist()) == [0, 1, 1, 2, 2]  # reused rows count 2; clear() keeps counts
    assert pool.schedulable_token_capacity(1000) == 1000 and pool.pre_alloc_size == 0
    pool.alloc_aux_to_lengths(req_pool_indices_cpu=torch.tensor([1]), target_seq_lens_cpu=torch.tensor([5]))
    pool.reset_aux_cache_allocator()
    with pytest.raises(ValueError, match="not modelled"):
        pool.attach_aux_cache(object())


@pytest.fixture(scope="module")
def sglang_budgets() -> Iterator[SimpleNamespace]:
    """SGLang 0.5.23's prefill_budget module from the reference tree; sys.modules restored afterwards."""
    path = reference_src_holding("sglang/srt/mem_cache/prefill_budget.py", "SGLang") / "sglang/srt/mem_cache/prefill_budget.py"
    import importlib.util
    import types

    saved = dict(sys.modules)
    try:
        for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.allocator"):
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
        swa = types.ModuleType("sglang.srt.mem_cache.allocator.swa")
        swa.is_swa_req_ring = lambda allocator: False  # ours have no per-request SWA ring (SGLang: an isinstance check)
        sys.modules[swa.__name__] = swa
        spec = importlib.util.spec_from_file_location("sglang.srt.mem_cache.prefill_budget", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        yield SimpleNamespace(PrefillBudget=module.PrefillBudget, SWAPrefillBudget=module.SWAPrefillBudget)
    finally:
        sys.modules.clear()
        sys.modules.update(saved)


def test_sglangs_own_prefill_budget_runs_over_our_paged_allocator(sglang_budgets: SimpleNamespace) -> None:
    a = paged_allocator(size=1024, page_size=16, device="cpu")
    held = a.alloc(256)
    tree = Tree(a, held[:64])
    budget = a.create_prefill_budget(tree, num_mixed_decode_tokens=8)
    assert type(budget) is sglang_budgets.PrefillBudget
    assert budget.remaining_total == 768 + 64 - 8  # free + evictable - the mixed decode tokens
    budget.reserve(100, 50)  # 100 tokens take 112; plus a page of headroom; plus 50 to generate
    assert budget.remaining_total == 824 - (112 + 16 + 50) and budget.remaining_current == 824 - 128
    assert budget.check_prefill(extend_input_len=600, total_tokens=600, max_new_tokens=0, input_tokens=600,
                                swa_host_hit_length=0, chunk_limit=None) == (True, None)
    assert budget.check_prefill(extend_input_len=700, total_tokens=700, max_new_tokens=0, input_tokens=700,
                                swa_host_hit_length=0, chunk_limit=None) == (False, None)


def test_sglangs_own_swa_prefill_budget_runs_over_our_swa_allocator(sglang_budgets: SimpleNamespace) -> None:
    a = swa_allocator(full_size=512, swa_size=128, page_size=16, device="cpu")
    a.alloc(64)
    tree = SimpleNamespace(full_evictable_size=lambda: 32, swa_evictable_size=lambda: 16,
                           supports_mamba=lambda: False, supports_prefix_sharing=lambda: True)
    budget = a.create_prefill_budget(tree)
    assert type(budget) is sglang_budgets.SWAPrefillBudget
    assert budget.remaining_swa == 64 + 16  # the window side's free + evictable
    assert budget.remaining_total == 448 + 32  # the full side's


def test_a_failing_on_alloc_hook_leaves_no_row_taken() -> None:
    pool = ReqToTokenPool(slot=request_table_slot(4, 8), device=torch.device("cpu"))

    def refuse(rows: list[int]) -> None:
        raise RuntimeError("hook failed (injected)")

    pool.register_on_alloc_rows(refuse)
    with pytest.raises(RuntimeError, match="injected"):
        pool.alloc_rows(2)
    assert pool.available_size() == 4


def test_free_slots_are_the_rows_alloc_can_still_hand_out() -> None:
    pool = ReqToTokenPool(slot=request_table_slot(4, 8), device=torch.device("cpu"))
    assert sorted(pool.free_slots) == [1, 2, 3, 4]  # row 0 is padding, never free to hand out
    taken = pool.alloc_rows(3)
    assert taken is not None and len(pool.free_slots) == 1 == pool.available_size()
    assert set(pool.free_slots).isdisjoint(taken)
    pool.free_rows(taken[:2])
    assert sorted(pool.free_slots) == sorted([*set(range(1, 5)) - set(taken), *taken[:2]])
    with pytest.raises(AttributeError):
        pool.free_slots.append(9)  # type: ignore[attr-defined]  # a copy: a reader cannot return a row behind the pool
    assert len(pool.free_slots) == 3


@pytest.fixture(scope="module")
def sglang_invariant_checker() -> Iterator[type]:
    """SGLang 0.5.23's SchedulerInvariantChecker from the reference tree, its imports stubbed (only the request-table
    check runs: strict idle checking on, so a leak raises); sys.modules restored afterwards."""
    relative = "sglang/srt/managers/scheduler_components/invariant_checker.py"
    path = reference_src_holding(relative, "SGLang") / relative
    import importlib.util
    import types

    def raise_error_or_warn(obj: Any, strict: bool, counter_name: str, message: str, log_interval: int = 1000) -> None:
        assert strict
        raise ValueError(message)

    known = {
        "sglang.srt.environ": {"envs": SimpleNamespace(SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=SimpleNamespace(
            get=lambda: True))},
        "sglang.srt.utils.common": {"raise_error_or_warn": raise_error_or_warn},
        "sglang.srt.observability.scheduler_stage_metrics": {"scheduler_stage_method": lambda stage: lambda f: f},
        "sglang.srt.mem_cache.memory_pool": {"ReqToTokenPool": ReqToTokenPool},
    }
    stubbed = ("sglang.srt.disaggregation.utils", "sglang.srt.managers.scheduler_components.pool_stats_observer",
               "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.allocator.page_interleave",
               "sglang.srt.mem_cache.allocator.swa", "sglang.srt.mem_cache.base_prefix_cache",
               "sglang.srt.runtime_context", "sglang.srt.utils.watchdog", *known)
    saved = dict(sys.modules)
    try:
        for name in sorted({n.rsplit(".", i)[0] for n in stubbed for i in range(n.count(".") + 1)}):
            module = types.ModuleType(name)
            module.__path__ = []
            module.__dict__.update(known.get(name, {}))
            module.__getattr__ = lambda attr, name=name: type(attr, (), {})  # any other name: a bare class
            sys.modules[name] = module
        spec = importlib.util.spec_from_file_location("sglang.srt.managers.scheduler_components.invariant_checker", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        yield module.SchedulerInvariantChecker
    finally:
        sys.modules.clear()
        sys.modules.update(saved)


def test_sglangs_own_idle_check_counts_our_request_table(sglang_invariant_checker: type) -> None:
    """_check_req_pool: free rows + rows a session holds == size + pre_alloc_size, else 'memory leak detected'."""
    pool = ReqToTokenPool(slot=request_table_slot(4, 8), device=torch.device("cpu"))
    held = {"rows": 0}
    checker = sglang_invariant_checker(
        is_hybrid_swa=False, is_hybrid_ssm=False, disaggregation_mode=None, page_size=1, full_tokens_per_layer=None,
        swa_tokens_per_layer=None, max_total_num_tokens=64, tree_cache=None, token_to_kv_pool_allocator=None,
        req_to_token_pool=pool, pool_stats_observer=SimpleNamespace(session_held_req_count=lambda: held["rows"]),
        get_last_batch=lambda: None, get_running_batch=lambda: None, scheduler_stage_metrics=None)
    checker._check_req_pool()  # idle: 4 free rows of 4
    rows = pool.alloc_rows(1)
    assert rows is not None
    with pytest.raises(ValueError, match="req_to_token_pool memory leak detected!available_size=3"):
        checker._check_req_pool()  # a row held by nobody the scheduler knows: 3 + 0 != 4
    held["rows"] = 1
    checker._check_req_pool()  # a session holds it: 3 + 1 == 4
    pool.free_rows(rows)
    held["rows"] = 0
    checker._check_req_pool()
