"""The model corpus (tests/model_corpus/, see SOURCES.md there): configs of 50+ decoder families.

Every supported one plans and builds on the meta device with the planned bytes equal to
the allocated bytes; bytes per token are checked by hand from the config's public fields,
parameter counts against the published totals; unsupported caches are refused (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.weights import count_parameters
from containers import EngineContainer
from kvcache.byte_units import GiB
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.sizing.layer_specs import RecurrentStateSpec, model_layer_specs
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).with_name("model_corpus")
REFUSED = {"DeepSeek-V4-Flash": "compressed sparse attention", "gemma-4-26B-A4B": "own head_dim and KV sharing"}
SUPPORTED = sorted(p.stem for p in CORPUS.glob("*.json") if p.stem not in REFUSED)


def corpus(name: str) -> ModelConfig:
    return model_config_from_hf(CORPUS / f"{name}.json", name=name)


def test_the_corpus_spans_forty_families() -> None:
    model_types = {json.loads((CORPUS / f"{n}.json").read_text())["model_type"] for n in SUPPORTED}
    assert len(SUPPORTED) >= 50 and len(model_types) >= 40


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_corpus_model_builds_on_meta_as_planned(name: str) -> None:
    model = corpus(name)  # a pure Mamba config states no length: 2048 (pure_ssm.DEFAULT_CONTEXT_LENGTH)
    args = ServerArgs.from_mapping({"device": "meta", "kv_cache_memory": 8 * GiB,
                                    "context_length": min(4096, model.max_position_embeddings)})
    engine = EngineContainer(server_args=args, model_config=model)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=4000 * GiB))
    engine.engine().bootstrap()
    runner = engine.engine().target
    assert runner.kv_cache.allocated_bytes == runner.memory_pool_config.total_bytes <= 8 * GiB
    engine.shutdown_resources()


@pytest.mark.parametrize(("name", "why"), sorted(REFUSED.items()))
def test_unsupported_caches_are_refused_in_one_line(name: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(CORPUS / f"{name}.json"), "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    assert why in err and "not supported" in err and "Traceback" not in err


def cache_bytes(name: str, tp: int = 1) -> tuple[int, int]:
    """(KV bytes per token, state bytes per request) of the whole model on one rank, model dtype, fp32 SSM state."""
    m = corpus(name)
    dtype = resolve_model_dtype("auto", m.checkpoint_dtype)
    placements = model_layer_specs(m, ParallelState(tp_size=tp), resolve_kv_cache_dtype("auto", dtype), model_dtype=dtype)
    state = [p.spec for p in placements if isinstance(p.spec, RecurrentStateSpec)]
    return (sum(p.spec.bytes_per_token for p in placements if not isinstance(p.spec, RecurrentStateSpec)),
            sum(s.bytes_per_request for s in state))


# layers x KV heads x (K + V head_dim) x bytes, from each config's public fields
@pytest.mark.parametrize(("name", "expected"), [
    ("Meta-Llama-3.1-70B", 80 * 8 * (128 + 128) * 2),  # 327,680
    ("Meta-Llama-3.1-405B", 126 * 8 * 256 * 2),  # 516,096
    ("Qwen3-30B-A3B", 48 * 4 * 256 * 2),  # 98,304: MoE does not change the cache
    ("Qwen1.5-MoE-A2.7B", 24 * 16 * 256 * 2),  # 196,608: Qwen2-MoE, shared expert with its gate
    ("Qwen3-235B-A22B", 94 * 4 * 256 * 2),  # 192,512
    ("Mixtral-8x22B-v0.1", 56 * 8 * 256 * 2),  # 229,376
    ("MiniMax-M2.5", 62 * 8 * 256 * 2),  # 253,952
    ("phi-4", 40 * 10 * 256 * 2),  # 204,800
    ("Phi-3-mini-4k-instruct", 32 * 32 * (96 + 96) * 2),  # 393,216: head_dim = 3072 / 32, sliding 2047 on every layer
    ("GLM-4-9B-0414", 40 * 2 * 256 * 2),  # 40,960
    ("c4ai-command-r-v01", 40 * 64 * 256 * 2),  # 1,310,720: MHA
    ("OLMo-2-1124-7B", 32 * 32 * 256 * 2),  # 524,288 (a float32 checkpoint runs in bf16)
    ("starcoder", 40 * 1 * 256 * 2),  # 20,480: multi_query = one KV head; n_embd / n_head aliases
    ("starcoder2-15b", 40 * 4 * 256 * 2),  # 81,920
    ("SmolLM3-3B", 36 * 4 * 256 * 2),  # 73,728
    ("Seed-OSS-36B-Instruct", 64 * 8 * 256 * 2),  # 262,144
    ("EXAONE-3.5-7.8B-Instruct", 32 * 8 * 256 * 2),  # 131,072: num_layers alias
    ("gemma-3-27b-it", 62 * 16 * 256 * 2),  # 507,904: text_config of a multimodal wrapper
    ("Mistral-Small-3.1-24B-Instruct-2503", 40 * 8 * 256 * 2),  # 163,840
    ("gpt-oss-120b", 36 * 8 * (64 + 64) * 2),  # 73,728
    ("Llama-4-Scout-17B-16E-Instruct", 48 * 8 * 256 * 2),  # 196,608 (36 chunked + 12 global layers)
    ("dbrx-instruct", 40 * 8 * 256 * 2),  # 163,840: attn_config.kv_n_heads, head_dim = d_model / n_heads
    # MLA: kv_lora_rank 512 + rope 64 per layer; DeepSeek-V3.2 and GLM-5 (index_topk set) add the indexer's
    # 128 fp8 key bytes + 4 bytes of float32 scale: SGLang 0.5.23's DSA pool, 1,284 B per layer in bf16
    ("Kimi-K2-Instruct", 61 * 576 * 2),  # 70,272
    ("DeepSeek-V3.2", 61 * (576 * 2 + 128 + 4)),  # 78,324
    ("GLM-5", 78 * (576 * 2 + 128 + 4)),  # 100,152
])
def test_bytes_per_token_by_hand(name: str, expected: int) -> None:
    assert cache_bytes(name)[0] == expected


# State per request, as SGLang 0.5.23's Mamba2StateShape / KimiLinearStateShape size it:
# conv (conv_dim x (kernel - 1)) in the model dtype (bf16) + SSM state in float32.
@pytest.mark.parametrize(("name", "tokens", "state"), [
    # Nemotron-3 Nano: 6 '*' layers of 2 KV heads; 23 'M' layers: conv 64 x 64 + 2 x 8 x 128 = 6,144 channels
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 6 * 2 * 256 * 2, 23 * (6_144 * 3 * 2 + 64 * 64 * 128 * 4)),
    # Qwen3.5-27B: 16 full layers of 4 KV heads x 256; 48 gated-delta layers: conv 2 x 16 x 128 + 48 x 128
    ("Qwen3.5-27B", 16 * 4 * 512 * 2, 48 * (10_240 * 3 * 2 + 48 * 128 * 128 * 4)),
    # Falcon-H1-0.5B: attention AND Mamba-2 on all 36 layers; conv 24 x 64 + 2 x 1 x 128 = 1,792
    ("Falcon-H1-0.5B-Base", 36 * 2 * 128 * 2, 36 * (1_792 * 3 * 2 + 24 * 64 * 128 * 4)),
    # Bamba-9B: attention on layers 9, 18, 27; conv 128 x 64 + 2 x 128 = 8,448
    ("Bamba-9B", 3 * 8 * 256 * 2, 29 * (8_448 * 3 * 2 + 128 * 64 * 128 * 4)),
    # Jamba: Mamba-1 (SGLang's full-rank shape: conv over 8,192 channels, state 8,192 x 16) on 28 layers
    ("Jamba-v0.1", 4 * 8 * 256 * 2, 28 * (8_192 * 3 * 2 + 8_192 * 16 * 4)),
    # Kimi-Linear: 7 MLA layers; 20 KDA layers: conv 3 x 32 x 128 = 12,288, state 32 x 128 x 128
    ("Kimi-Linear-48B-A3B-Instruct", 7 * 576 * 2, 20 * (12_288 * 3 * 2 + 32 * 128 * 128 * 4)),
    # Zamba-2: 9 hybrid layers hold KV (32 heads x 2 x 2560 / 32 = 160 dims) and all 54 a Mamba-2 state
    ("Zamba2-2.7B", 9 * 32 * 320 * 2, 54 * ((80 * 64 + 2 * 64) * 3 * 2 + 80 * 64 * 64 * 4)),
])
def test_hybrid_token_and_state_bytes_by_hand(name: str, tokens: int, state: int) -> None:
    assert cache_bytes(name) == (tokens, state)


# Published totals (model cards). Within 1% unless noted.
@pytest.mark.parametrize(("name", "published"), [
    ("Meta-Llama-3.1-70B", 70.6e9), ("Meta-Llama-3.1-405B", 405.9e9), ("Qwen3-30B-A3B", 30.5e9),
    ("Qwen3-235B-A22B", 235e9), ("Mixtral-8x22B-v0.1", 141e9), ("MiniMax-M2.5", 229e9), ("gpt-oss-120b", 116.8e9),
    ("Llama-4-Maverick-17B-128E-Instruct", 400e9), ("Qwen3.5-397B-A17B", 397e9), ("GLM-5", 744e9),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 31.6e9), ("phi-4", 14.7e9), ("Phi-3-mini-4k-instruct", 3.82e9),
    ("Phi-3.5-MoE-instruct", 41.9e9), ("OLMoE-1B-7B-0924", 6.92e9), ("Jamba-v0.1", 51.6e9), ("Bamba-9B", 9.78e9),
    ("c4ai-command-r-v01", 35e9), ("granite-3.1-8b-instruct", 8.17e9), ("GLM-4-9B-0414", 9.4e9),
    ("starcoder2-15b", 15.96e9), ("starcoder", 15.5e9), ("SmolLM3-3B", 3.08e9), ("mistral-nemo-instruct-2407", 12.2e9),
    ("codellama-34b-instruct-hf", 33.7e9), ("yi-34b", 34.4e9), ("gemma-3-27b-it", 27.4e9),
    ("Qwen2-VL-7B-Instruct", 8.29e9), ("Mistral-Small-3.1-24B-Instruct-2503", 24.0e9), ("Qwen1.5-MoE-A2.7B", 14.3e9),
    ("ERNIE-4.5-21B-A3B-PT", 21.8e9), ("dbrx-instruct", 132e9),
])
def test_parameters_match_the_published_total(name: str, published: float) -> None:
    assert count_parameters(corpus(name)) == pytest.approx(published, rel=0.01)


def test_deepseek_v32_with_its_mtp_layer_is_the_published_685b() -> None:
    m = corpus("DeepSeek-V3.2")
    assert count_parameters(m) + count_parameters(m, nextn=True) == pytest.approx(685e9, rel=0.01)
