"""vLLM 0.34.0's own KV cache planner beside ours (`--engine vllm`) and the project's default (SGLang) plan.

For each corpus model on an H200-sized card this prints bytes per token, the SGLang-rules plan's
tokens and running requests, and for vLLM: our planner's block size, groups, num_gpu_blocks and
max concurrency next to what vLLM 0.34.0's code makes of the same layers and the same available
memory (`get_kv_cache_groups`, `get_kv_cache_configs`, `get_max_concurrency_for_kv_cache_config`
from vllm/v1/core/kv_cache_planning.py and kv_cache_utils.py, executed from the source tree).

What vLLM's code is given (the rest is its own): one KVCacheSpec per cached layer built from the
project's layer specs (heads, head sizes, KV dtype; Mamba state shapes and dtypes with the SSM
dtype vllm_rules names), at the block size and padded Mamba page our `resolve_block_size` chose
(vLLM's platform hook that aligns them needs its model registry and backends), and a VllmConfig
stand-in holding the settings vLLM's planner reads (layer-outer LBNHC layout, no override, no
HiSparse, max_model_len, max_num_batched_tokens, async scheduling, whether the hybrid manager is off).

    python benchmarks/vllm_kv_plan.py [--reference-src DIR] [--gpu H200] [--max-model-len N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_allocators import _Anything, _definition_from, _placeholder, _StubFinder, _load  # noqa: E402
from reference_tree import add_reference_src_argument  # noqa: E402

from app.cli import main as cli_main  # noqa: E402
from kvcache.engines import vllm_rules  # noqa: E402
from kvcache.engines.vllm_answer import vllm_answer  # noqa: E402
from kvcache.engines.vllm_layers import VllmSettings, vllm_layer_specs, vllm_layers  # noqa: E402
from kvcache.engines.vllm_plan import VllmPlan, plan_vllm, resolve_block_size  # noqa: E402
from kvcache.errors import BudgetBelowOneRequestError, UnsupportedModelError  # noqa: E402
from kvcache.byte_units import GiB  # noqa: E402
from kvcache.inputs.cards import KNOWN_CARDS  # noqa: E402
from kvcache.sizing.runtime_reserve import RuntimeShape  # noqa: E402
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype  # noqa: E402
from kvcache.inputs.parallel import ParallelState  # noqa: E402
from kvcache.memory.torch_dtypes import torch_dtype  # noqa: E402
from kvcache.models.model_config import ModelConfig  # noqa: E402
from kvcache.sizing.layer_specs import (  # noqa: E402
    FullAttentionSpec, LayerPlacement, MLASpec, RecurrentStateSpec, SlidingWindowSpec,
)
from kvcache.models.hf_config import model_config_from_hf  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "model_corpus"
PLANNER_FILES = {
    "vllm.utils.math_utils": "vllm/utils/math_utils.py",
    "vllm.v1.kv_cache_spec_registry": "vllm/v1/kv_cache_spec_registry.py",
    "vllm.v1.kv_cache_layout": "vllm/v1/kv_cache_layout.py",
    "vllm.v1.kv_cache_interface": "vllm/v1/kv_cache_interface.py",
    "vllm.v1.core.kv_cache_utils": "vllm/v1/core/kv_cache_utils.py",
    "vllm.v1.core.kv_cache_config_builder": "vllm/v1/core/kv_cache_config_builder.py",
    "vllm.v1.core.kv_cache_planning": "vllm/v1/core/kv_cache_planning.py",
}


def load_vllm_planner(root: Path) -> SimpleNamespace:
    """vLLM 0.34.0's planner modules from `root`, with stand-ins for the runtime they import (callers restore
    sys.modules and sys.meta_path afterwards, as tests/test_bench_vllm_steps.py does)."""
    sys.meta_path.insert(0, _StubFinder(("vllm",), set(PLANNER_FILES)))
    stubs = {
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.utils.torch_utils": {"get_dtype_size": lambda dtype: torch.empty((), dtype=dtype).element_size()},
        "vllm.utils.mem_utils": {"format_gib": lambda n: f"{n / (1 << 30):.2f}"},
        "vllm.v1.hisparse.layout": {"get_hisparse_kv_cache_groups": lambda config, specs: None,
                                     "get_hisparse_host_pool_bytes": lambda config: 0,
                                     "get_hisparse_kv_cache_config": None},
    }
    for name, attributes in stubs.items():
        module = _Anything(name)
        for key, value in attributes.items():
            setattr(module, key, value)
        sys.modules[name] = module
    modules = {name: _load(name, root / rel) for name, rel in PLANNER_FILES.items()}
    _register_spec_kinds(root, modules["vllm.v1.kv_cache_interface"], modules["vllm.v1.kv_cache_spec_registry"])
    planning = modules["vllm.v1.core.kv_cache_planning"]
    planning.get_kv_cache_config_builder = lambda config: planning.DefaultKVCacheConfigBuilder()
    return SimpleNamespace(interface=modules["vllm.v1.kv_cache_interface"], planning=planning,
                           utils=modules["vllm.v1.core.kv_cache_utils"],
                           layout=modules["vllm.v1.kv_cache_layout"].KVCacheLayout)


class _Names(dict):  # type: ignore[type-arg]
    """Globals for one vLLM function run on its own: the spec classes it names, stand-ins for anything else."""

    def __missing__(self, name: str) -> Any:
        return _placeholder(name)


def _register_spec_kinds(root: Path, interface: types.ModuleType, registry: types.ModuleType) -> None:
    """Run vLLM's own register_all_kvcache_specs (which spec kinds group together) with stand-in managers:
    its module, the single-type managers, needs the whole runtime."""
    names = _Names(vars(interface), KVCacheSpecRegistry=registry.KVCacheSpecRegistry)
    register = _definition_from(root / "vllm/v1/core/single_type_kv_cache_manager.py",
                                "register_all_kvcache_specs", names)
    register(None)


def vllm_config(vllm: SimpleNamespace, settings: VllmSettings, *, hybrid_manager_off: bool) -> SimpleNamespace:
    """The fields of a VllmConfig that vLLM's planner reads, set as vLLM 0.34.0 defaults them on CUDA."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=hybrid_manager_off,
                                         max_num_batched_tokens=settings.max_num_batched_tokens),
        cache_config=SimpleNamespace(num_gpu_blocks_override=None, prefix_cache_retention_interval=None,
                                     get_resolved_kv_cache_layout=lambda: vllm.layout.LBNHC,
                                     mamba_cache_mode=settings.mamba_cache_mode, enable_extensible_kv_cache=True,
                                     resolved_gpu_memory_utilization=1.0),
        attention_config=SimpleNamespace(hisparse_config=None),
        model_config=SimpleNamespace(max_model_len=settings.max_model_len,
                                     original_max_model_len=settings.max_model_len,
                                     supports_kv_cache_grouping=False),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, decode_context_parallel_size=1,
                                        pipeline_parallel_size=1),
        device_config=SimpleNamespace(device_type="cuda"),
        max_in_flight_tokens=settings.max_in_flight_tokens,
        num_prefill_lookahead_tokens=0, speculative_config=None,
    )


def vllm_specs(vllm: SimpleNamespace, placements: tuple[LayerPlacement, ...], layer_kinds: tuple[str, ...],
               block_size: int, mamba_page: int, settings: VllmSettings) -> dict[str, Any]:
    """One vLLM KVCacheSpec per cached layer, named as vLLM names them. A Mamba layer's block is max_model_len
    in mamba_cache_mode "none" and the attention block in "align" (MambaModelConfig.verify_and_update_config),
    with the prefill checkpoint blocks its mixer declares (vllm_rules.mamba_checkpoint)."""
    i = vllm.interface
    specs: dict[str, Any] = {}
    for n, p in enumerate(placements):
        s, name = p.spec, f"model.layers.{p.layer_id}.{n}"
        if isinstance(s, (FullAttentionSpec, SlidingWindowSpec)):
            common = dict(block_size=block_size, num_kv_heads=s.kv_heads, head_size=s.head_dim,
                          head_size_v=s.v_head_dim, dtype=torch_dtype(s.dtype.storage_dtype))
            if isinstance(s, FullAttentionSpec):
                specs[name] = i.FullAttentionSpec(**common)
            elif layer_kinds[p.layer_id] == "chunked_attention":
                specs[name] = i.ChunkedLocalAttentionSpec(**common, attention_chunk_size=s.window)
            else:
                specs[name] = i.SlidingWindowSpec(**common, sliding_window=s.window)
        elif isinstance(s, MLASpec) and s.index_head_dim:
            specs.update(sparse_mla_specs(vllm, s, name, block_size))
        elif isinstance(s, MLASpec):
            specs[name] = i.MLAAttentionSpec(block_size=block_size, num_kv_heads=1,
                                             head_size=s.kv_lora_rank + s.qk_rope_head_dim,
                                             dtype=torch_dtype(s.dtype.storage_dtype), cache_dtype_str="auto")
        elif isinstance(s, RecurrentStateSpec):
            state = s.bytes_per_request
            align = settings.mamba_cache_mode == "align"
            specs[name] = i.MambaSpec(block_size=block_size if align else settings.max_model_len,
                                      shapes=(s.conv_shape, s.ssm_shape), dtypes=(torch_dtype(s.conv_dtype), torch_dtype(s.ssm_dtype)),
                                      page_size_padded=mamba_page if mamba_page > state else None,
                                      mamba_cache_mode=settings.mamba_cache_mode,
                                      num_prefill_checkpoint_blocks=settings.mamba_checkpoint.blocks if align else 0,
                                      prefill_checkpoint_alignment=settings.mamba_checkpoint.alignment)
    return specs


def sparse_mla_specs(vllm: SimpleNamespace, s: MLASpec, name: str, block_size: int) -> dict[str, Any]:
    """A sparse-attention MLA layer's two caches as DeepSeek-V3.2's model code declares them (indexer first):
    DeepseekV32IndexerCache.get_kv_cache_spec (uint8 rows of index_head_dim + a float32 scale per 128) and
    MLAAttention.get_kv_cache_spec (576 values in the KV dtype, rows aligned as align_blocks_to_rows does;
    fp8: the fp8_ds_mla row, state_content_bytes 656)."""
    i = vllm.interface
    width = s.kv_lora_rank + s.qk_rope_head_dim
    indexer = i.MLAAttentionSpec(block_size=block_size, num_kv_heads=1, max_tp_shards=1,
                                 head_size=s.index_head_dim + s.index_head_dim // 128 * 4, dtype=torch.uint8,
                                 cache_role=i.SparseCacheRole.INDEXER)
    if s.dtype.name == "fp8_e4m3":
        latent = i.MLAAttentionSpec(block_size=block_size, num_kv_heads=1, max_tp_shards=1, head_size=width,
                                    dtype=torch.uint8, cache_dtype_str="fp8_ds_mla", state_content_bytes=656,
                                    is_index_group_leader=True)
    else:
        dtype = torch_dtype(s.dtype.storage_dtype)
        latent = i.MLAAttentionSpec(block_size=block_size, num_kv_heads=1, max_tp_shards=1, head_size=width,
                                    dtype=dtype, cache_dtype_str="auto", is_index_group_leader=True,
                                    block_stride_alignment=width * dtype.itemsize)
    return {f"{name}.indexer.k_cache": indexer, f"{name}.attn": latent}


@dataclass(frozen=True)
class VllmCodeAnswer:
    """What vLLM's own code planned: its groups, num_blocks and max concurrency."""

    groups: int
    num_blocks: int
    max_concurrency: float


def vllm_code_plan(vllm: SimpleNamespace, placements: tuple[LayerPlacement, ...], layer_kinds: tuple[str, ...],
                   available_bytes: int, settings: VllmSettings) -> VllmCodeAnswer:
    """vLLM 0.34.0's get_kv_cache_groups + get_kv_cache_configs + max concurrency for these layers and bytes."""
    block_size, mamba_page = resolve_block_size(vllm_layers(placements, layer_kinds), settings)
    config = vllm_config(vllm, settings, hybrid_manager_off=vllm_rules.hybrid_manager_disabled(layer_kinds))
    specs = vllm_specs(vllm, placements, layer_kinds, block_size, mamba_page, settings)
    groups = vllm.planning.get_kv_cache_groups(config, dict(specs))
    (kv_config,) = vllm.planning.get_kv_cache_configs(config, [specs], [available_bytes], groups)
    concurrency = vllm.utils.get_max_concurrency_for_kv_cache_config(config, kv_config)
    return VllmCodeAnswer(len(kv_config.kv_cache_groups), kv_config.num_blocks, concurrency)


def corpus_layers(name: str, tp_size: int = 1) -> tuple[ModelConfig, tuple[LayerPlacement, ...]]:
    """A corpus model's layer specs on one rank as vLLM keeps them: KV in the model dtype, vLLM's SSM dtype."""
    model = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    model_dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
    placements = vllm_layer_specs(model, ParallelState(tp_size=tp_size), resolve_kv_cache_dtype("auto", model_dtype),
                                  model_dtype=model_dtype)
    return model, placements


def for_model(model: ModelConfig, settings: VllmSettings) -> VllmSettings:
    """`settings` with the prefill checkpoint this model's recurrent layers declare (used in align mode only)."""
    return replace(settings, mamba_checkpoint=vllm_rules.mamba_checkpoint(model.architecture, model.hf_config))


def ours(name: str, available_bytes: int, settings: VllmSettings) -> VllmPlan:
    model, placements = corpus_layers(name)
    return plan_vllm(placements, model.layer_kinds, available_bytes=available_bytes,
                     settings=for_model(model, settings))


TP_SIZES = (1, 2, 4, 8)


def sglang_plan(name: str, gpu: str, context_length: int) -> tuple[int, dict[str, Any]] | None:
    """The smallest TP size at which the project's default (SGLang 0.5.23 rules) plan fits, and that plan
    as `plan --json` reports it (one rank); None where none of TP_SIZES fits."""
    for tp in TP_SIZES:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = cli_main(["plan", "--model", str(CORPUS / f"{name}.json"), "--gpu", gpu, "--tp-size", str(tp),
                             "--context-length", str(context_length), "--json"])
        if code == 0:
            return tp, json.loads(out.getvalue())
    return None


def print_side_by_side(vllm: SimpleNamespace, gpu: str, max_model_len: int, models: list[str] | None = None) -> None:
    """One row per corpus model (or those of `models`): bytes per token, SGLang's tokens and requests, vLLM's
    blocks and concurrency."""
    total = KNOWN_CARDS[gpu].budget_total_bytes  # cudaMemGetInfo's, which vLLM's utilization multiplies
    print(f"card {gpu} ({total:,} B); vLLM {vllm_rules.VLLM_VERSION}: gpu_memory_utilization "
          f"{vllm_rules.DEFAULT_GPU_MEMORY_UTILIZATION}, KV = card x utilization - weights - estimated runtime "
          f"(activation peak + non-torch + CUDA graphs, estimated as the project's runtime reserve); "
          f"context min({max_model_len}, the model's)")
    head = ("model", "TP", "B/token", "SGL tokens", "SGL reqs", "vLLM KV GiB", "block", "groups", "B/block",
            "blocks ours", "blocks vLLM", "conc ours", "conc vLLM", "vLLM tokens")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for name in models or sorted(p.stem for p in CORPUS.glob("*.json")):
        try:
            model, _ = corpus_layers(name)
        except UnsupportedModelError as e:
            print(f"{name} | refused: {str(e).split(':')[1].strip()[:60]}")
            continue
        length = min(max_model_len, model.max_position_embeddings)
        found = sglang_plan(name, gpu, length)
        if found is None:
            print(f"{name} | - | weights do not fit {gpu} up to TP {TP_SIZES[-1]}")
            continue
        tp, sglang = found
        model, layers = corpus_layers(name, tp)
        dtype = resolve_model_dtype("auto", model.checkpoint_dtype)
        sgl = " | ".join([str(tp), *(f"{sglang[k]:,}" if sglang[k] is not None else "-"  # none: a pure state-space model
                                     for k in ("bytes_per_token", "max_total_num_tokens", "max_running_requests"))])
        try:
            answer = vllm_answer(model, ParallelState(tp_size=tp), resolve_kv_cache_dtype("auto", dtype),
                                 model_dtype=dtype, total_bytes=total, weights_bytes=sglang["weights_bytes"],
                                 runtime=RuntimeShape(cuda_graphs=True, uses_mla="mla" in model.layer_kinds, tp_size=tp),
                                 max_model_len=length)
        except (UnsupportedModelError, BudgetBelowOneRequestError) as e:
            print(f"{name} | {sgl} | vLLM refuses: {str(e).splitlines()[0][:70]}")
            continue
        settings = for_model(model, VllmSettings(max_model_len=length, max_num_batched_tokens=answer.max_num_batched_tokens,
                                                 mamba_cache_mode=answer.mamba_cache_mode))
        theirs = vllm_code_plan(vllm, layers, model.layer_kinds, answer.available_bytes, settings)
        print(f"{name} | {sgl} | {answer.available_bytes / GiB:.1f} | {answer.block_size} | {len(answer.groups)} | "
              f"{answer.bytes_per_block:,} | {answer.num_gpu_blocks:,} | {theirs.num_blocks:,} | "
              f"{answer.max_concurrency:.2f} | {theirs.max_concurrency:.2f} | {answer.kv_cache_tokens:,}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_reference_src_argument(parser, "vllm/ (vLLM 0.34.0's sources)")
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--models", nargs="+", help="only these corpus models (tests/model_corpus, by file stem)")
    args = parser.parse_args(argv)
    print_side_by_side(load_vllm_planner(args.reference_src), args.gpu, args.max_model_len, args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
