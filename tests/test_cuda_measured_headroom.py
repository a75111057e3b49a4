"""On a CUDA device: the measured bootstrap (the default) runs the worst-case step, keeps its peak plus the margin
free as cudaMemGetInfo sees it, and never holds fewer tokens than the static plan. Skipped without CUDA (the
H200 numbers: benchmarks/RESULTS.md)."""

from __future__ import annotations

import gc

import pytest
import torch
from dependency_injector import providers

from kvcache.byte_units import MiB
from kvcache.models.presets import load_model_config
from kvcache.testing import FixedActivationStep

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ARGS = {"device": "cuda", "cuda_graph_max_bs": 16, "max_running_requests": 64, "context_length": 4096,
        "chunked_prefill_size": 2048}


def _free() -> int:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def test_the_default_bootstrap_measures_the_worst_case_step_and_keeps_its_headroom(make_engine):
    engine = make_engine(model="Llama-3.2-1B-Instruct", **ARGS)
    engine.engine().bootstrap()
    runner = engine.engine().target
    m = runner.measured_sizing
    assert m is not None and [s.name for s in m.steps] == ["prefill_chunk", "eager_decode", "alternating"]
    assert m.tokens_after == runner.max_total_num_tokens >= m.static_tokens
    assert _free() >= m.headroom_bytes
    requests = runner.decode_requests()  # the resized pools run both steps
    rows = requests.add(64)
    assert runner.decode(requests.step(rows, torch.zeros(64, dtype=torch.int64, device="cuda"))).shape[0] == 64
    requests.release(rows)


def test_a_fake_step_of_known_bytes_is_what_the_headroom_keeps(make_engine):
    engine = make_engine(model="Llama-3.2-1B-Instruct", **ARGS)
    fake = FixedActivationStep.factory({"prefill_chunk": 3000 * MiB})
    engine.target.worst_case_step.override(providers.Callable(fake))
    engine.engine().bootstrap()
    m = engine.engine().target.measured_sizing
    assert fake.last.built_with == {"chunked_prefill_size": 2048, "decode_batch": 64, "largest_graph_batch": 16,
                                    "mixed_chunk": False}
    assert 3000 * MiB <= m.peak_bytes <= 3002 * MiB  # the caching allocator rounds a large block to 2 MiB
    assert _free() >= m.headroom_bytes


def test_mixed_chunk_is_a_measured_step(make_engine):
    engine = make_engine(model="Llama-3.2-1B-Instruct", **{**ARGS, "enable_mixed_chunk": True})
    engine.engine().bootstrap()
    m = engine.engine().target.measured_sizing
    assert [s.name for s in m.steps] == ["prefill_chunk", "eager_decode", "mixed_chunk", "alternating"]
    assert m.tokens_after >= m.static_tokens and _free() >= m.headroom_bytes


def test_mla_prefills_a_chunk_over_a_context_it_up_projects(make_engine):
    """DeepSeek-V2-Lite cut to 2 layers (one dense, one of 64 experts), a context of 12,288 tokens: the 2,048-token
    chunk over 10,240 tokens of context (above SGLang's 8,192 threshold)."""
    from kvcache.models.hf_config import model_config_from_hf

    hf = {**load_model_config("DeepSeek-V2-Lite").hf_config, "num_hidden_layers": 2}
    engine = make_engine(model=model_config_from_hf(hf, name="DeepSeek-V2-Lite-2-layers"), **{**ARGS, "context_length": 12288})
    engine.engine().bootstrap()
    m = engine.engine().target.measured_sizing
    assert [s.name for s in m.steps] == ["prefill_chunk", "eager_decode", "mla_context", "alternating"]
    assert m.tokens_after >= m.static_tokens and _free() >= m.headroom_bytes
