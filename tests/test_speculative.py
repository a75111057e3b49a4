"""Target and draft workers: one container class, shared table and allocator, one budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dependency_injector import providers

from containers import EngineContainer
from kvcache.byte_units import GiB, MiB
from kvcache.inputs.dtypes import KV_CACHE_DTYPES
from kvcache.errors import ConfigError
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.presets import PRESET_DIR
from kvcache.inputs.server_args import ServerArgs

LLAMA_EAGLE = {"speculative_algorithm": "EAGLE3", "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}


@pytest.fixture
def engine_for(make_engine):  # type: ignore[no-untyped-def]
    """engine_for(model, probe_gib, device="meta", **server_args) -> an engine on a simulated card."""
    def make(model: str, probe_gib: int, device: str = "meta", **args) -> EngineContainer:  # type: ignore[no-untyped-def]
        return make_engine(model=model, probe=FixedMemoryProbe(total_bytes=probe_gib * GiB), device=device, **args)
    return make


@pytest.mark.parametrize(
    ("model", "args", "target_bytes", "draft_bytes"),
    [
        # Llama-3-8B shape: 32 x 8 x (128 + 128) x 2 = 131,072; a one-layer EAGLE draft: 1 x 8 x 256 x 2 = 4,096
        ("Llama-3.1-8B-Instruct", LLAMA_EAGLE, 131_072, 4_096),
        # DeepSeek-V3: 61 x (512 + 64) x 2 = 70,272; its one NEXTN layer: 1 x 576 x 2 = 1,152
        ("DeepSeek-V3", {"speculative_algorithm": "NEXTN", "tp_size": 8}, 70_272, 1_152),
    ],
)
def test_the_target_pays_for_the_draft_per_token(model: str, args: dict, target_bytes: int, draft_bytes: int, engine_for) -> None:
    engine = engine_for(model, 141, **args)
    engine.engine().bootstrap()
    plan = engine.engine().target.memory_pool_config
    assert plan.bytes_per_token == target_bytes + draft_bytes
    assert [p.bytes_per_token for p in plan.kv_pools] == [target_bytes, draft_bytes]


def test_target_and_draft_share_the_very_same_table_and_allocator(engine_for) -> None:
    engine = engine_for("Llama-3.1-8B-Instruct", 80, **LLAMA_EAGLE)
    runtime = engine.engine()
    runtime.bootstrap()
    target, draft = runtime.target, runtime.draft
    assert draft is not None
    assert draft.req_to_token_pool is target.req_to_token_pool
    assert draft.token_to_kv_pool_allocator is target.token_to_kv_pool_allocator
    assert draft.memory_pool_config is target.memory_pool_config
    assert draft.token_to_kv_pool is not target.token_to_kv_pool
    assert draft.token_to_kv_pool.size == target.token_to_kv_pool.size == target.max_total_num_tokens
    plan = target.memory_pool_config
    # what both workers allocated adds up to the one plan, within the one budget
    assert target.kv_cache.allocated_bytes + draft.kv_cache.allocated_bytes == plan.total_bytes
    assert plan.total_bytes <= plan.budget.budget_bytes


def test_the_draft_weights_are_inside_the_measured_use(engine_for) -> None:
    engine = engine_for("Llama-3.1-8B-Instruct", 80, **LLAMA_EAGLE)
    runtime = engine.engine()
    runtime.bootstrap()
    budget = runtime.target.memory_pool_config.budget
    both = runtime.target.weights.total_bytes + runtime.draft.weights.total_bytes
    assert budget.free_before_load_bytes - budget.free_after_load_bytes == both


def test_an_index_from_the_shared_allocator_is_valid_in_both_pools(tmp_path: Path, make_engine) -> None:
    # a draft of another shape (SmolLM2-135M's 3 KV heads of 64) that shares the tiny model's 256-token vocabulary
    draft = json.loads((PRESET_DIR / "SmolLM2-135M.json").read_text()) | {"vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(draft))
    args = {"device": "cpu", "kv_cache_memory": 24 * MiB, "speculative_algorithm": "STANDALONE",
            "speculative_draft_model": str(tmp_path)}
    engine = make_engine(probe=FixedMemoryProbe(total_bytes=GiB), **args)
    runtime = engine.engine()
    runtime.bootstrap()
    loc = runtime.target.token_to_kv_pool_allocator.alloc(3)
    target_pool, draft_pool = runtime.target.token_to_kv_pool, runtime.draft.token_to_kv_pool
    k = torch.ones(3, 2, 16, dtype=torch.bfloat16)
    target_pool.set_kv_buffer(0, loc, k, k)
    draft_k = torch.full((3, 3, 64), 2.0, dtype=torch.bfloat16)
    draft_pool.set_kv_buffer(0, loc, draft_k, draft_k)
    assert torch.equal(target_pool.get_key_buffer(0)[loc], k)
    assert torch.equal(draft_pool.get_key_buffer(0)[loc], draft_k)


def test_overriding_a_draft_provider_does_not_touch_the_target(engine_for) -> None:
    engine = engine_for("Llama-3.1-8B-Instruct", 80, **LLAMA_EAGLE)
    engine.draft.forward_stream.override(providers.Object("draft-stream"))
    assert engine.draft.forward_stream() == "draft-stream"
    assert engine.target.forward_stream() != "draft-stream"
    assert engine.target.model_runner().forward_stream != "draft-stream"


def test_a_draft_whose_pool_the_target_did_not_pay_for_is_refused(engine_for) -> None:
    engine = engine_for("Llama-3.1-8B-Instruct", 80, **LLAMA_EAGLE)
    runtime = engine.engine()
    runtime.target.load_weights()
    runtime.draft.load_weights()
    runtime.target.init_memory_pool()
    # the draft now claims another KV dtype than the one the target planned for
    engine.draft.kv_cache_dtype.override(providers.Object(KV_CACHE_DTYPES["fp8_e4m3"]))
    with pytest.raises(ConfigError, match="costs 2048 bytes/token but the target paid for 4096"):
        runtime.draft.init_memory_pool()


def test_the_draft_cannot_configure_before_the_target(engine_for) -> None:
    engine = engine_for("Llama-3.1-8B-Instruct", 80, **LLAMA_EAGLE)
    runtime = engine.engine()
    runtime.draft.load_weights()
    with pytest.raises(Exception, match="target worker's KV cache is not configured yet"):
        runtime.draft.init_memory_pool()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"speculative_algorithm": "EAGLE"}, "needs --speculative-draft-model"),
        ({"speculative_algorithm": "NEXTN", "speculative_draft_model": "x"}, "drop --speculative-draft-model"),
        ({"speculative_num_steps": 3}, "without --speculative-algorithm"),
        ({"speculative_algorithm": "EAGLE", "speculative_draft_model": "x", "speculative_num_steps": 3,
          "speculative_num_draft_tokens": 8}, "must be --speculative-num-steps \\+ 1 = 4"),
        ({"speculative_algorithm": "EAGLE", "speculative_draft_model": "x", "pp_size": 2}, "not supported with --pp-size 2"),
    ],
)
def test_speculative_cross_field_rules(args: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerArgs.from_mapping(args)


def test_nextn_needs_a_model_with_mtp_layers(make_engine) -> None:
    engine = make_engine(model="Llama-3.1-8B-Instruct", device="meta", speculative_algorithm="NEXTN")
    with pytest.raises(ConfigError, match="no next-token-prediction layers"):
        engine.draft_model_config()
