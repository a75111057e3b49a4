"""Post-capture KV resize, the pure part: who may resize, the fraction a plan starts from, the smaller plan.

Numbers are worked by hand from the planner's formula (kvcache.sizing.planning) and SGLang 0.5.23's
reserves: 1536 MiB + tp * pp / 8 GiB when post-capture sizing is planned.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvcache.byte_units import GiB, MiB
from kvcache.configurator import KVCacheConfigurator
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.planning import plan_cost, plan_pool_sizes
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest
from kvcache.sizing.pool_layout import worker_cache_layout
from kvcache.models.presets import load_model_config
from kvcache.runtime.resize import compute_post_capture_kv_resize, post_capture_headroom_bytes
from kvcache.sizing.resized_plan import resized_plan_request
from kvcache.sizing.post_capture_eligibility import is_post_capture_kv_active, post_capture_eligibility, post_capture_reserve_mib
from kvcache.runtime.resize import PostCaptureResizeError
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.runtime.streams import HostStream
from kvcache.allocators.factory import allocator_for_plan
from kvcache.testing import FixedMemoryProbe, tiny_model_config

H200_BYTES = 150_109_880_320  # cudaMemGetInfo's total on an H200 (kvcache/inputs/cards.py)
BPT = 256  # the tiny model's KV bytes per token in bf16


def _layout(model, kv="auto"):  # type: ignore[no-untyped-def]
    dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    kv_dtype = resolve_kv_cache_dtype(kv, dtype)
    layout = worker_cache_layout(model_config=model, parallel_state=ParallelState(), kv_cache_dtype=kv_dtype,
                                 model_dtype=dtype)
    return layout, kv_dtype


def _eligibility(model=None, *, device="cuda", draft=False, kv="auto", **args):  # type: ignore[no-untyped-def]
    layout, kv_dtype = _layout(model or tiny_model_config(), kv)
    server_args = ServerArgs.from_mapping({"enable_post_capture_kv_resize": True, **args})
    return post_capture_eligibility(server_args=server_args, device_type=device, is_draft_worker=draft,
                                    layout=layout, kv_cache_dtype=kv_dtype)


def test_a_cuda_target_with_the_knob_on_resizes_dense_and_mla_pools():
    assert _eligibility().active
    assert _eligibility(load_model_config("DeepSeek-V2-Lite"), kv="fp8_e4m3").active
    layout, kv_dtype = _layout(tiny_model_config())
    assert is_post_capture_kv_active(server_args=ServerArgs(enable_post_capture_kv_resize=True), device_type="cuda",
                                     is_draft_worker=False, layout=layout, kv_cache_dtype=kv_dtype)


def test_a_cuda_target_measures_its_headroom_by_default_and_not_with_a_fraction_given():
    assert _eligibility(enable_post_capture_kv_resize=False).measured
    assert _eligibility(enable_post_capture_kv_resize=False, kv_headroom="measured", mem_fraction_static=0.8).measured
    resize = _eligibility(mem_fraction_static=0.8)  # the knob alone: the fraction's headroom, as SGLang
    assert resize.active and not resize.measured


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"enable_post_capture_kv_resize": False, "kv_headroom": "fraction"}, "--enable-post-capture-kv-resize"),
    ({"enable_post_capture_kv_resize": False, "mem_fraction_static": 0.8}, "--kv-headroom measured"),
    ({"device": "cpu"}, "CUDA device"),
    ({"device": "meta"}, "CUDA device"),
    ({"draft": True}, "draft worker"),
    ({"kv_cache_memory": GiB}, "--kv-cache-memory"),
    ({"speculative_algorithm": "EAGLE3", "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}, "draft pools"),
    ({"model": "Qwen3-Next-80B-A3B-Thinking"}, "recurrent-state"),
    ({"model": "gemma-2-9b-it"}, "sliding-window"),
    ({"model": "DeepSeek-V2-Lite", "kv": "fp4_e2m1"}, "FP4"),
])
def test_what_turns_the_resize_off_is_said(kwargs, reason):
    kwargs = dict(kwargs)
    if "model" in kwargs:
        kwargs["model"] = load_model_config(kwargs["model"])
    answer = _eligibility(**kwargs)
    assert not answer.active and reason in answer.reason


def _configurator(**args) -> KVCacheConfigurator:  # type: ignore[no-untyped-def]
    model = load_model_config("Llama-3.1-8B-Instruct")
    dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    return KVCacheConfigurator(
        settings=SizingSettings.from_server_args(ServerArgs.from_mapping(args)), model_config=model,
        parallel_state=ParallelState(), model_dtype=dtype, kv_cache_dtype=resolve_kv_cache_dtype("auto", dtype),
        device=torch.device("cuda"), memory_probe=FixedMemoryProbe(total_bytes=H200_BYTES),
        allocator_factory=allocator_for_plan, forward_stream=HostStream(torch.device("cuda")),
    )


def test_a_plan_that_will_be_resized_starts_from_the_higher_fraction():
    card_mib = Fraction(H200_BYTES, MiB)
    # static (SGLang 0.5.23): 512 + 1.5 * 8192 + 2 * 256 + 1024/8 + 8 * 58 prefill graphs = 13904 MiB;
    # resized: 1536 + 128 = 1664 MiB
    assert _configurator(kv_headroom="fraction").sizing.mem_fraction_static(H200_BYTES) == float(round((card_mib - 13904) / card_mib, 3)) == 0.903
    resized = _configurator(enable_post_capture_kv_resize=True)
    assert resized.sizing.post_capture_resize().active
    assert resized.sizing.mem_fraction_static(H200_BYTES) == float(round((card_mib - 1664) / card_mib, 3)) == 0.988
    assert post_capture_reserve_mib(tp_size=8, pp_size=2) == 1536 + 2048
    assert _configurator(enable_post_capture_kv_resize=True, mem_fraction_static=0.8).sizing.mem_fraction_static(H200_BYTES) == 0.8


def _plan(budget: int = 64 * MiB, *, page: int = 1, fraction: float = 0.9, **kwargs):  # type: ignore[no-untyped-def]
    budget_struct = MemoryBudget(budget_bytes=budget, total_bytes=GiB, free_before_load_bytes=GiB,
                                 free_after_load_bytes=GiB - 8 * MiB, mem_fraction_static=fraction,
                                 kv_cache_memory_bytes=None)
    pools = (KVPoolDemand(name="full", kind="full", num_layers=2, bytes_per_token=BPT),)
    return plan_pool_sizes(PlanRequest(budget=budget_struct, page_size=page, context_length=256,
                                       req_to_token_row_width=256, kv_pools=pools, **kwargs))


def test_headroom_is_what_the_fraction_kept_back_and_the_eager_reserve_above_the_captured_batch():
    plan = _plan(max_running_requests=64)
    # 1 GiB * (1 - 9/10), rounded: 107,374,182 bytes
    assert post_capture_headroom_bytes(plan=plan, pre_model_load_bytes=GiB, cuda_graph_max_bs=64,
                                       activation_reserve_mib=Fraction(10240)) == 107_374_182
    assert post_capture_headroom_bytes(plan=plan, pre_model_load_bytes=GiB, cuda_graph_max_bs=32,
                                       activation_reserve_mib=Fraction(10240)) == 10 * GiB


def test_enough_free_memory_keeps_the_plan_it_never_grows():
    plan = _plan()
    resize = compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=10 * GiB, headroom_bytes=GiB)
    assert resize.after == plan and not resize.changed and resize.released_bytes == 0


def test_too_little_free_memory_shrinks_to_the_largest_plan_that_keeps_the_headroom():
    plan = _plan(64 * MiB)
    # 64 MiB budget: index 32 B/token (two free logs of 2 int64 each) + KV 256 B/token + table; bisection
    # puts the plan at 64 MiB or just under
    short = 8 * MiB
    slack = 4 * 2 * MiB  # 2 layers * K and V * one 2 MiB page
    resize = compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=GiB, headroom_bytes=GiB + short,
                                            mapping_slack_bytes=slack)
    after = resize.after
    budget = plan.total_bytes - short - slack
    assert after.budget.budget_bytes == budget
    assert after.total_bytes <= budget < after.total_bytes + BPT + 32 + 2 * MiB  # one more token would not fit...
    assert plan_cost(resized_plan_request(plan, budget), after.max_total_num_tokens + 1, 0) > budget  # ...by the planner's own cost
    assert after.max_total_num_tokens < plan.max_total_num_tokens
    assert after.max_running_requests == plan.max_running_requests
    assert after.kv_pools[0].bytes_per_token == plan.kv_pools[0].bytes_per_token
    assert resize.released_bytes == plan.total_bytes - after.total_bytes >= short + slack - 2 * MiB


def test_a_paged_plan_shrinks_in_whole_pages():
    plan = _plan(64 * MiB, page=16)
    after = compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=0, headroom_bytes=5 * MiB).after
    assert after.max_total_num_tokens % 16 == 0 and after.max_total_num_tokens < plan.max_total_num_tokens


def test_a_resize_that_cannot_keep_the_headroom_says_what_to_change():
    plan = _plan(64 * MiB)
    with pytest.raises(PostCaptureResizeError) as err:
        compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=0, headroom_bytes=GiB)
    first = str(err.value).splitlines()[0]
    assert "short of the 1.00 GiB (1,073,741,824 B) headroom" in first and "--cuda-graph-max-bs" in str(err.value)


def test_a_resize_that_would_cut_running_requests_is_refused():
    plan = _plan(64 * MiB, max_running_requests=100_000)  # capped at tokens // 2
    assert plan.max_running_requests == plan.max_total_num_tokens // 2
    with pytest.raises(PostCaptureResizeError, match="running requests") as err:
        compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=0, headroom_bytes=4 * MiB)
    # needed: the whole plan (request table and allocator lists too) capped at two tokens per running request
    keeping = _plan(64 * MiB, max_running_requests=plan.max_running_requests,
                    max_total_tokens=2 * plan.max_running_requests)
    assert keeping.max_running_requests == plan.max_running_requests
    assert err.value.needed_bytes == keeping.total_bytes > 2 * plan.max_running_requests * plan.bytes_per_token


@settings(max_examples=40, deadline=None)
@given(free=st.integers(0, 80 * MiB), headroom=st.integers(0, 80 * MiB), page=st.sampled_from([1, 16, 64]))
def test_the_resized_plan_never_grows_and_always_keeps_the_headroom(free, headroom, page):
    plan = _plan(64 * MiB, page=page, max_running_requests=16)
    try:
        resize = compute_post_capture_kv_resize(plan=plan, free_after_capture_bytes=free, headroom_bytes=headroom)
    except PostCaptureResizeError:
        assert plan.total_bytes + free - headroom < plan.total_bytes
        return
    assert resize.tokens_after <= resize.tokens_before
    assert resize.after.total_bytes <= resize.before.total_bytes
    # what stays free after releasing the difference covers the headroom
    assert free + resize.released_bytes >= headroom
