"""Our vLLM planner against vLLM 0.34.0's own code, over the model corpus: equal groups, blocks, max concurrency.

vLLM's get_kv_cache_groups / get_kv_cache_configs / get_max_concurrency_for_kv_cache_config run from
a vLLM 0.34.0 source tree (benchmarks/vllm_kv_plan.py loads them) on the same layers and the same
available memory. Skips without that tree (KVCACHE_REFERENCE_SRC names it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from reference_sources import benchmarks_importable, reference_src_holding

from kvcache.engines.vllm_layers import VllmSettings
from kvcache.errors import ConfigError, UnsupportedModelError
from kvcache.byte_units import GiB

CORPUS = Path(__file__).with_name("model_corpus")
NAMES = sorted(p.stem for p in CORPUS.glob("*.json"))
SPARSE_MLA = {"DeepSeek-V3.2", "GLM-5"}  # an indexer key cache per layer beside the MLA latent
# (available bytes, settings): the H200 case of the benchmark, small blocks on a tight budget (which the sparse
# MLA kernels refuse: 64-token kernel blocks), and blocks of twice the sparse kernel's
CASES = {
    "100GiB-32k": (100 * GiB, VllmSettings(max_model_len=32768)),
    "9GiB-4k-block16": (9 * GiB + 12_345, VllmSettings(max_model_len=4096, block_size=16, max_num_batched_tokens=2048)),
    "9GiB-4k-block128": (9 * GiB + 12_345, VllmSettings(max_model_len=4096, block_size=128,
                                                         max_num_batched_tokens=2048)),
    # prefix caching on, vLLM's default: hybrids' Mamba layers in mamba_cache_mode "align"
    "100GiB-32k-align": (100 * GiB, VllmSettings(max_model_len=32768, mamba_cache_mode="align")),
    "9GiB-4k-block16-align": (9 * GiB + 12_345, VllmSettings(max_model_len=4096, block_size=16,
                                                              max_num_batched_tokens=2048, mamba_cache_mode="align")),
}


@pytest.fixture(scope="module")
def bench() -> Iterator[SimpleNamespace]:
    """The benchmark module and vLLM's planner; the stand-in modules are removed afterwards."""
    reference_src = reference_src_holding("vllm/v1/core/kv_cache_planning.py", "vLLM 0.34.0")
    with benchmarks_importable():
        import vllm_kv_plan

        yield SimpleNamespace(module=vllm_kv_plan, vllm=vllm_kv_plan.load_vllm_planner(reference_src))


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_counts_equal_vllms_own_code(bench: SimpleNamespace, case: str) -> None:
    available, settings = CASES[case]
    compared, differ, block_refused = [], [], set()
    for name in NAMES:
        try:
            ours = bench.module.ours(name, available, settings)
        except UnsupportedModelError:
            continue  # DeepSeek-V4, Gemma-4 (not read at all)
        except ConfigError as exc:  # a block size vLLM's sparse MLA kernels cannot split
            assert str(exc).startswith(f"--block-size {settings.block_size}:")
            block_refused.add(name)
            continue
        model, layers = bench.module.corpus_layers(name)
        theirs = bench.module.vllm_code_plan(bench.vllm, layers, model.layer_kinds, available,
                                             bench.module.for_model(model, settings))
        got = (len(ours.groups), ours.num_blocks, ours.max_concurrency)
        if got != (theirs.groups, theirs.num_blocks, theirs.max_concurrency):
            differ.append(f"{name}: ours {got}, vLLM {theirs}")
        compared.append(name)
    assert not differ
    assert len(compared) >= 30 and {"gpt-oss-120b", "gemma-3-27b-it", "Bamba-9B", "Qwen3.5-27B"} <= set(compared)
    assert block_refused == (SPARSE_MLA if settings.block_size == 16 else set())
    assert block_refused or SPARSE_MLA <= set(compared)


def test_refusals_and_the_estimated_length_equal_vllms_own_check(bench: SimpleNamespace) -> None:
    """vLLM refuses to start where one request of max_model_len does not fit (get_kv_cache_configs'
    _check_enough_kv_cache_memory, the null block kept back) and names its estimated maximum model length; ours
    refuses the same configs and suggests that length as --context-length (3 GiB, 65,536: 61 compared, 44 refused)."""
    import re

    from kvcache.errors import BudgetBelowOneRequestError

    available, settings = 3 * GiB + 4321, VllmSettings(max_model_len=65536)
    compared, refused, differ = [], 0, []
    for name in NAMES:
        try:
            ours_refusal = None
            bench.module.ours(name, available, settings)
        except UnsupportedModelError:
            continue
        except BudgetBelowOneRequestError as exc:
            ours_refusal = exc
        model, layers = bench.module.corpus_layers(name)
        try:
            bench.module.vllm_code_plan(bench.vllm, layers, model.layer_kinds, available, settings)
            theirs = None
        except ValueError as exc:
            found = re.search(r"estimated maximum model length is (\d+)", str(exc))
            theirs = int(found.group(1)) if found else 0
        ours = None
        if ours_refusal is not None:
            length = [s for s in ours_refusal.suggestions if s.startswith("--max-model-len ")]
            ours = int(length[0].split()[1]) if length else 0
        if ours != theirs:
            differ.append(f"{name}: ours {ours}, vLLM {theirs}")
        compared.append(name)
        refused += theirs is not None
    assert not differ
    assert len(compared) >= 30 and refused >= 5
