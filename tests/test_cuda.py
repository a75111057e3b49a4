"""On a CUDA device: the bytes the configurator allocates are exactly the plan's, and the headroom it
promises stays free on cudaMemGetInfo. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from kvcache.byte_units import GiB, MiB

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("Llama-3.1-8B-Instruct", {}),
        ("Llama-3.1-8B-Instruct", {"kv_cache_dtype": "fp8_e4m3", "page_size": 16}),
        ("DeepSeek-V2-Lite", {"page_size": 64}),
        ("gpt-oss-20b", {}),
        ("Qwen3-Next-80B-A3B-Thinking", {}),
    ],
)
def test_memory_allocated_grows_by_exactly_the_plan(make_engine, model: str, extra: dict) -> None:
    engine = make_engine(model=model, device="cuda", kv_cache_memory=2 * GiB, context_length=8192, **extra)
    configurator = engine.target.configurator()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    result = configurator.configure(pre_model_load_memory=engine.memory_probe().free_bytes())
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    plan = result.memory_pool_config
    assert grown == plan.total_bytes == result.allocated_bytes
    assert plan.total_bytes <= 2 * GiB
    del result


def test_bootstrap_keeps_the_promised_headroom_free(make_engine) -> None:
    engine = make_engine(model="SmolLM2-135M", device="cuda", mem_fraction_static=0.5)
    runner = engine.engine().target
    runner.initialize()
    plan = runner.memory_pool_config
    b = plan.budget
    keep_free = round(b.free_before_load_bytes * 0.5)
    assert b.budget_bytes == b.free_after_load_bytes - keep_free
    assert runner.weights is not None and runner.weights.total_bytes == 129 * 2 * MiB  # one arena
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    slack = torch.cuda.mem_get_info()[0] - keep_free
    # the arena lowers free memory by exactly the plan: what is left is the budget the plan did not use
    assert slack == b.budget_bytes - plan.total_bytes
    assert 0 <= slack < 2 * MiB
