"""On a CUDA device: the bytes the configurator allocates are exactly the plan's. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from containers import EngineContainer
from kvcache.byte_units import GiB
from kvcache.presets import load_model_config
from kvcache.server_args import ServerArgs

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
def test_memory_allocated_grows_by_exactly_the_plan(model: str, extra: dict) -> None:
    args = ServerArgs.from_mapping({"device": "cuda", "kv_cache_memory": 2 * GiB, "context_length": 8192, **extra})
    engine = EngineContainer(server_args=args, model_config=load_model_config(model))
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
    engine.shutdown_resources()


def test_bootstrap_on_the_card_stays_inside_the_measured_budget() -> None:
    args = ServerArgs.from_mapping({"device": "cuda", "mem_fraction_static": 0.5})
    engine = EngineContainer(server_args=args, model_config=load_model_config("SmolLM2-135M"))
    runner = engine.engine().target
    runner.initialize()
    plan = runner.memory_pool_config
    b = plan.budget
    assert b.budget_bytes == b.free_after_load_bytes - round(b.free_before_load_bytes * 0.5)
    assert plan.total_bytes <= b.budget_bytes
    assert runner.weights is not None and runner.weights.total_bytes == 134_515_008 * 2
    free_now = torch.cuda.mem_get_info()[0]
    assert free_now >= b.free_before_load_bytes * 0.5 - 64 * 2**20  # what the fraction keeps free stays free
    engine.shutdown_resources()
