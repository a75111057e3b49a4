"""DeepSeek-V3.2 / GLM-5 (sparse attention) with an fp8 KV cache: the latent row SGLang 0.5.23 stores.

SGLang 0.5.23 (mem_cache: the DSA pool's fp8 layout) keeps per token per layer
  512 fp8 nope bytes + 512 / 128 = 4 float32 scales (16 B) + 64 bf16 RoPE values (128 B) = 656 B,
where a plain fp8 latent is 512 + 64 = 576 B; the indexer's key adds 128 fp8 bytes + 1 float32 scale = 132 B.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from containers import EngineContainer
from kvcache.byte_units import GiB
from kvcache.pools.dsa_latent_rows import unpack_latent
from kvcache.sizing.dsa_latent import DSAFp8Latent
from kvcache.inputs.dtypes import BFLOAT16, KV_CACHE_DTYPES
from kvcache.errors import ConfigError
from kvcache.sizing.layer_specs import MLASpec
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.pool_layout import worker_cache_layout
from kvcache.pools import MLATokenToKVPool
from kvcache.testing.pool_plans import standalone_kv_pool
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).with_name("model_corpus")
CPU = torch.device("cpu")


def corpus(name: str) -> ModelConfig:
    return model_config_from_hf(CORPUS / f"{name}.json", name=name)


def mla_spec(name: str, kv: str) -> MLASpec:
    layout = worker_cache_layout(model_config=corpus(name), parallel_state=ParallelState(),
                                 kv_cache_dtype=KV_CACHE_DTYPES[kv], model_dtype=BFLOAT16)
    spec = next(g.spec for g in layout.kv_groups if g.name == "mla")
    assert isinstance(spec, MLASpec)
    return spec


@pytest.mark.parametrize(
    ("name", "kv", "per_layer"),
    [
        ("DeepSeek-V3.2", "fp8_e4m3", 512 + 16 + 128 + 132),  # 788: packed latent + indexer key
        ("GLM-5", "fp8_e4m3", 512 + 16 + 128 + 132),
        ("DeepSeek-V3.2", "bfloat16", 576 * 2 + 132),  # 1,284: bf16 rows carry no scales
        ("DeepSeek-V3.2", "fp8_e5m2", 576 + 132),  # SGLang packs only e4m3; e5m2 keeps the plain 576 B row
        ("Kimi-K2-Instruct", "fp8_e4m3", 576),  # no indexer, not sparse attention: the plain fp8 latent
    ],
)
def test_bytes_per_token_per_layer_by_hand(name: str, kv: str, per_layer: int) -> None:
    assert mla_spec(name, kv).bytes_per_token == per_layer


def test_the_fp8_pool_holds_exactly_the_planned_656_byte_rows() -> None:
    spec = mla_spec("DeepSeek-V3.2", "fp8_e4m3")
    pool = standalone_kv_pool(spec, tokens=63, layer_ids=[0, 1])
    assert isinstance(pool, MLATokenToKVPool)
    assert pool.packed_latent == spec.packed_latent
    assert pool.get_key_buffer(1).shape == (64, 1, 656) and pool.get_key_buffer(1).dtype == torch.uint8
    assert pool.nbytes == 2 * 64 * (656 + 132) == 2 * 64 * spec.bytes_per_token  # 100,864 B, a 512 B multiple
    with pytest.raises(ValueError, match="packed"):
        pool.get_value_buffer(0)


def test_a_written_latent_reads_back_within_one_fp8_step() -> None:
    layout = DSAFp8Latent(512, 64)
    pool = standalone_kv_pool(MLASpec(512, 64, KV_CACHE_DTYPES["fp8_e4m3"], index_head_dim=128), tokens=8,
                              layer_ids=[3])
    assert isinstance(pool, MLATokenToKVPool)
    assert pool.packed_latent == layout and pool.index_row_bytes == 132
    nope = torch.randn(2, 1, 512, dtype=torch.bfloat16) * torch.tensor([1.0, 100.0]).repeat_interleave(256)
    rope = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    pool.set_mla_kv_buffer(3, torch.tensor([4, 6]), nope, rope)
    rows = pool.get_key_buffer(3)[[4, 6]]
    restored = unpack_latent(layout, rows)
    assert torch.equal(restored[..., 512:], rope.float())  # the RoPE part is kept exactly, in bf16
    tiles = nope.float().reshape(2, 1, 4, 128)
    scales = rows[..., 512:528].contiguous().view(torch.float32)  # [2, 1, 4]: amax / 448 per tile
    assert torch.equal(scales, tiles.abs().amax(-1) / 448)
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of its magnitude, plus the scale's float32 rounding
    error = (restored[..., :512] - nope.float()).abs().reshape(2, 1, 4, 128)
    assert bool((error <= tiles.abs() / 16 + scales.unsqueeze(-1) * 1e-3).all())
    assert not pool.get_key_buffer(3)[[0, 5]].any()  # other rows untouched


def test_a_rank_that_is_not_a_multiple_of_the_tile_is_refused() -> None:
    with pytest.raises(ConfigError, match="kv_lora_rank 320 is not a multiple of 128"):
        DSAFp8Latent(320, 64)


def test_deepseek_v32_fp8_builds_on_meta_as_planned() -> None:
    args = ServerArgs.from_mapping({"device": "meta", "kv_cache_memory": 8 * GiB, "context_length": 4096,
                                    "kv_cache_dtype": "fp8_e4m3", "page_size": 64})
    engine = EngineContainer(server_args=args, model_config=corpus("DeepSeek-V3.2"))
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=4000 * GiB))
    engine.engine().bootstrap()
    runner = engine.engine().target
    plan = runner.memory_pool_config
    assert plan.pool("mla").bytes_per_token == 61 * (656 + 132)  # 48,068
    assert runner.kv_cache.allocated_bytes == plan.total_bytes <= 8 * GiB
    engine.shutdown_resources()


def test_a_bf16_plan_that_does_not_fit_is_exit_3_even_where_fp8_has_no_layout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The advice tries fp8 KV; for a rank fp8's tiles do not divide, that try raised the fp8 refusal
    ("use --kv-cache-dtype bfloat16") as the outcome of a bf16 run: exit 2 with advice to use what was used."""
    import json

    from app.cli import main

    config = json.loads((CORPUS / "DeepSeek-V3.2.json").read_text()) | {"kv_lora_rank": 96}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    argv = ["plan", "--model", str(path), "--gpu", "H200", "--tp-size", "8", "--kv-cache-memory", "10MiB"]  # < a page + the table
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit" in err and "fp8" not in err
