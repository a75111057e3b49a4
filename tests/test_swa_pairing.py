"""Hybrid-ness (a sliding-window pool paired with a full one) is decided once, by the plan.

The allocator is SWA-paired exactly when the plan has a window pool (the target's, else a draft's);
a worker's attention pool is hybrid exactly when the plan gives that worker its own window pool.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from containers import EngineContainer
from kvcache.allocators import SWATokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvcache.byte_units import GiB
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.pools import HybridSWAKVPool, MHATokenToKVPool
from kvcache.models.presets import load_model_config
from kvcache.inputs.server_args import ServerArgs

PRESETS = Path(__file__).resolve().parents[1] / "kvcache" / "models" / "presets"


def _engine(target: str, draft: str | None = None) -> EngineContainer:
    settings: dict[str, object] = {"device": "meta", "kv_cache_memory": 2 * GiB, "context_length": 4096}
    if draft is not None:
        settings |= {"speculative_algorithm": "STANDALONE", "speculative_draft_model": draft}
    engine = EngineContainer(server_args=ServerArgs.from_mapping(settings), model_config=load_model_config(target))
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=80 * GiB))
    engine.engine().bootstrap()
    return engine


def test_a_target_with_a_window_pool_gets_an_swa_allocator_and_a_hybrid_pool() -> None:
    engine = _engine("gpt-oss-20b")
    runner = engine.engine().target
    plan = runner.memory_pool_config
    assert plan.window_pool(draft=False) is plan.paired_window_pool is plan.pool("swa")
    assert isinstance(runner.token_to_kv_pool_allocator, SWATokenToKVPoolAllocator)
    assert isinstance(runner.kv_cache.token_to_kv_pool, HybridSWAKVPool)
    engine.shutdown_resources()


def test_only_the_draft_pairs_a_window_pool(tmp_path: Path) -> None:
    """A full-attention target with a sliding/full draft: the one shared allocator maps full -> SWA for the
    draft's hybrid pool; the target's own pool stays plain."""
    draft = json.loads((PRESETS / "Llama-3.2-1B-Instruct.json").read_text())
    draft |= {"layer_types": ["sliding_attention", "full_attention"] * (draft["num_hidden_layers"] // 2),
              "sliding_window": 1024, "is_hybrid_swa": True}  # opts in to SGLang 0.5.23's window pools
    path = tmp_path / "config.json"
    path.write_text(json.dumps(draft))
    engine = _engine("Llama-3.2-1B-Instruct", str(path))
    target, drafted = engine.engine().target, engine.engine().draft
    plan = target.memory_pool_config
    assert plan.window_pool(draft=False) is None and plan.paired_window_pool is plan.window_pool(draft=True)
    assert plan.paired_window_pool.name == "draft_swa"  # type: ignore[union-attr]
    allocator = target.token_to_kv_pool_allocator
    assert isinstance(allocator, SWATokenToKVPoolAllocator)
    assert type(target.kv_cache.token_to_kv_pool) is MHATokenToKVPool
    hybrid = drafted.kv_cache.token_to_kv_pool
    assert isinstance(hybrid, HybridSWAKVPool) and drafted.token_to_kv_pool_allocator is allocator
    engine.shutdown_resources()


@pytest.mark.parametrize("model", ["Llama-3.2-1B-Instruct", "Mistral-7B-v0.1"])  # all full; all sliding
def test_without_a_window_pool_nothing_is_paired(model: str) -> None:
    engine = _engine(model)
    runner = engine.engine().target
    assert runner.memory_pool_config.paired_window_pool is None
    assert type(runner.token_to_kv_pool_allocator) is TokenToKVPoolAllocator
    assert type(runner.kv_cache.token_to_kv_pool) is MHATokenToKVPool
    engine.shutdown_resources()
