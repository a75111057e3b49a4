"""A pure state-space model's state bytes against SGLang 0.5.23's and vLLM 0.34.0's own code, side by side.

SGLang: `Mamba2StateShape.create` / `create_full_rank` and `Mamba2CacheParams.mamba_cache_per_req`
(srt/configs/mamba_utils.py, loaded whole; its two runtime imports stood in for: `divide` is SGLang's own function,
the environment's dtypes SGLang's defaults, bfloat16 conv and no SSM override). vLLM: `MambaStateShapeCalculator`
and `MambaStateDtypeCalculator` (model_executor/layers/mamba/mamba_utils.py, run on their own with vLLM's own
`divide` and `get_kv_cache_torch_dtype`, the default "SD" conv layout) and `MambaSpec.page_size_bytes`. Each engine
is given the fields its model class reads from the config (cited per case). Skips without the sources
(KVCACHE_REFERENCE_SRC).
"""

from __future__ import annotations

import __future__

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from reference_sources import benchmarks_importable, reference_src_holding

from kvcache.engines.vllm_layers import vllm_layer_specs
from kvcache.inputs.dtypes import FLOAT32, resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.models.hf_config import model_config_from_hf
from kvcache.sizing.layer_specs import RecurrentStateSpec, model_layer_specs

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CORPUS = Path(__file__).with_name("model_corpus")
NAMES = ("Mamba-Codestral-7B-v0.1", "falcon-mamba-7b", "GraniteMoeHybrid-default-transformers5")
TP_SIZES = (1, 2, 4, 8)


def _hf(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / f"{name}.json").read_text())


def _ours(name: str, tp: int, engine: str) -> int:
    """One request's state on one rank as our plan sizes it for `engine` (SGLang: float32 SSM state)."""
    m = model_config_from_hf(CORPUS / f"{name}.json", name=name)
    dtype = resolve_model_dtype("auto", m.checkpoint_dtype)
    kv = resolve_kv_cache_dtype("auto", dtype)
    parallel = ParallelState(tp_size=tp)
    if engine == "vllm":
        placements = vllm_layer_specs(m, parallel, kv, model_dtype=dtype)
    else:
        placements = model_layer_specs(m, parallel, kv, model_dtype=dtype, ssm_dtype=FLOAT32)
    return sum(p.spec.bytes_per_request for p in placements if isinstance(p.spec, RecurrentStateSpec))


@pytest.fixture(scope="module")
def sglang_mamba_utils() -> Iterator[ModuleType]:
    root = reference_src_holding("sglang/srt/configs/mamba_utils.py", "SGLang 0.5.23")
    sys.path.insert(0, str(BENCHMARKS))
    from reference_allocators import _definition_from

    sys.path.remove(str(BENCHMARKS))
    distributed = ModuleType("sglang.srt.distributed.utils")
    namespace: dict[str, Any] = {}
    _definition_from(root / "sglang/srt/distributed/utils.py", "ensure_divisibility", namespace)
    distributed.divide = _definition_from(root / "sglang/srt/distributed/utils.py", "divide", namespace)
    environ = ModuleType("sglang.srt.environ")
    environ.envs = SimpleNamespace(SGLANG_MAMBA_CONV_DTYPE=SimpleNamespace(get=lambda: "bfloat16"),  # environ.py's
                                   SGLANG_MAMBA_SSM_DTYPE=SimpleNamespace(get=lambda: None))  # defaults
    stand_ins = {"sglang.srt.distributed.utils": distributed, "sglang.srt.environ": environ}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location("sglang_0523_mamba_utils", root / "sglang/srt/configs/mamba_utils.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def _sglang_state(mu: ModuleType, name: str, tp: int) -> int:
    """SGLang 0.5.23's mamba_cache_per_req, from the fields its config class passes (configs/mamba2.py,
    configs/mamba.py, configs/granitemoehybrid.py), divided over the ranks as its pool allocates (whole layers)."""
    hf = _hf(name)
    arch = hf["architectures"][0]
    if arch == "Mamba2ForCausalLM":
        shape = mu.Mamba2StateShape.create(
            tp_world_size=tp, intermediate_size=hf["intermediate_size"], n_groups=hf["n_groups"],
            num_heads=hf["num_heads"], head_dim=hf["head_dim"], state_size=hf["state_size"],
            conv_kernel=hf["conv_kernel"])
    elif arch == "FalconMambaForCausalLM":
        shape = mu.Mamba2StateShape.create_full_rank(
            tp_world_size=tp, intermediate_size=hf["intermediate_size"], state_size=hf["state_size"],
            conv_kernel=hf["conv_kernel"])
    else:  # GraniteMoeHybridConfig: mamba_intermediate_size = mamba_expand x hidden_size
        shape = mu.Mamba2StateShape.create(
            tp_world_size=tp, intermediate_size=hf["mamba_expand"] * hf["hidden_size"], n_groups=hf["mamba_n_groups"],
            num_heads=hf["mamba_n_heads"], head_dim=hf["mamba_d_head"], state_size=hf["mamba_d_state"],
            conv_kernel=hf["mamba_d_conv"])
    return mu.Mamba2CacheParams(shape=shape, layers=list(range(hf["num_hidden_layers"]))).mamba_cache_per_req


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_state_bytes_equal_sglangs_own_code(sglang_mamba_utils: ModuleType, name: str, tp: int) -> None:
    assert _ours(name, tp, "sglang") == _sglang_state(sglang_mamba_utils, name, tp)


@pytest.fixture(scope="module")
def vllm_state() -> Iterator[SimpleNamespace]:
    """vLLM's state shape and dtype calculators, its divide and dtype resolution, and its MambaSpec."""
    root = reference_src_holding("vllm/model_executor/layers/mamba/mamba_utils.py", "vLLM 0.34.0")
    with benchmarks_importable():
        import vllm_kv_plan
        from reference_allocators import _definition_from

        planner = vllm_kv_plan.load_vllm_planner(root)
        names: dict[str, Any] = {"torch": torch}
        _definition_from(root / "vllm/distributed/utils.py", "ensure_divisibility", names)
        _definition_from(root / "vllm/distributed/utils.py", "divide", names)
        _definition_from(root / "vllm/utils/torch_utils.py", "STR_DTYPE_TO_TORCH_DTYPE", names)
        _definition_from(root / "vllm/utils/torch_utils.py", "get_kv_cache_torch_dtype", names)
        names["is_conv_state_dim_first"] = lambda: False  # get_conv_state_layout: "SD" unless VLLM_SSM_CONV_STATE_LAYOUT
        mamba_utils = root / "vllm/model_executor/layers/mamba/mamba_utils.py"
        yield SimpleNamespace(shapes=_definition_from(mamba_utils, "MambaStateShapeCalculator", names),
                              dtypes=_definition_from(mamba_utils, "MambaStateDtypeCalculator", names),
                              spec=planner.interface.MambaSpec)


def _vllm_state(v: SimpleNamespace, name: str, tp: int) -> int:
    """vLLM 0.34.0's page of one request's state (mamba_cache_dtype and mamba_ssm_cache_dtype "auto"), from the
    fields its model class passes (models/mamba.py for Mamba and Falcon-Mamba, models/mamba2.py,
    models/granitemoehybrid.py), times the layers."""
    hf = _hf(name)
    arch = hf["architectures"][0]
    model_dtype = torch.bfloat16  # the checkpoints' bfloat16; the Granite default states none, and vLLM casts float32 down
    if arch == "FalconMambaForCausalLM":
        shapes = v.shapes.mamba1_state_shape(tp_world_size=tp, intermediate_size=hf["intermediate_size"],
                                             state_size=hf["state_size"], conv_kernel=hf["conv_kernel"])
        dtypes = v.dtypes.mamba1_state_dtype(model_dtype, "auto", "auto")
    else:
        granite = arch == "GraniteMoeHybridForCausalLM"
        prefix = "mamba_" if granite else ""
        shapes = v.shapes.mamba2_state_shape(
            tp_world_size=tp, intermediate_size=hf[f"{prefix}expand"] * hf["hidden_size"],
            n_groups=hf["mamba_n_groups" if granite else "n_groups"], num_heads=hf["mamba_n_heads" if granite else "num_heads"],
            head_dim=hf["mamba_d_head" if granite else "head_dim"], state_size=hf["mamba_d_state" if granite else "state_size"],
            conv_kernel=hf["mamba_d_conv" if granite else "conv_kernel"], num_spec=0)
        dtypes = v.dtypes.mamba2_state_dtype(model_dtype, "auto", "auto")
    page = v.spec(shapes=shapes, dtypes=dtypes, block_size=hf.get("max_position_embeddings", 2048)).page_size_bytes
    return page * hf["num_hidden_layers"]


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_state_bytes_equal_vllms_own_code(vllm_state: SimpleNamespace, name: str, tp: int) -> None:
    assert _ours(name, tp, "vllm") == _vllm_state(vllm_state, name, tp)


def _method_from(path: Path, cls: str, name: str, namespace: dict[str, Any]) -> Any:
    """One method of a class in a source file, executed on its own as a plain function (its module imports half the
    runtime); `namespace` holds what its body names."""
    import ast

    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", flags=__future__.annotations.compiler_flag),
         namespace)
    return namespace[name]


# The budget, in GiB as SGLang 0.5.23 profiles it (rest_memory), and whether the model's radix cache keeps SGLang's
# extra-buffer tracking slots (Granite-4: its arch is in the mamba radix-cache branch and supports them).
SIZING = {"Mamba-Codestral-7B-v0.1": False, "falcon-mamba-7b": False, "GraniteMoeHybrid-default-transformers5": True}


def _sglang_sizing(mu: ModuleType, name: str, budget_gib: int, *, disable_radix_cache: bool = False,
                   max_running_requests: int | None = None) -> tuple[int, int]:
    """(state slots, running requests) as SGLang 0.5.23's KVCacheConfigurator methods size them: _handle_max_mamba_cache
    (the slots: the --mamba-full-memory-ratio share, or without the radix cache one a --max-running-requests),
    _calculate_mamba_ratio and resolve_max_num_reqs, run on their own at its defaults over the token capacity its
    DefaultPoolConfigurator gives a model without per-token KV (`_zero_kv_max_tokens`: the context length, 2,048)."""
    root = reference_src_holding("sglang/srt/mem_cache/kv_cache_configurator.py", "SGLang 0.5.23")
    sys.path.insert(0, str(BENCHMARKS))
    from reference_allocators import _definition_from

    sys.path.remove(str(BENCHMARKS))
    source = root / "sglang/srt/mem_cache/kv_cache_configurator.py"
    hf = _hf(name)
    schedule = SimpleNamespace(max_mamba_cache_size=None, mamba_full_memory_ratio=0.9,
                               max_running_requests=max_running_requests, disable_overlap_schedule=False)
    extra = SIZING[name] and not disable_radix_cache
    names: dict[str, Any] = {
        "get_schedule": lambda: schedule,
        "get_memory": lambda: SimpleNamespace(disable_radix_cache=disable_radix_cache),
        "get_exec": lambda: SimpleNamespace(mamba=SimpleNamespace(
            enable_linear_replayssm_spec=False, enable_mamba_extra_buffer=extra, enable_mamba_extra_buffer_lazy=False)),
        "get_context": lambda: SimpleNamespace(override=lambda key, **values: vars(schedule).update(values)),
        "envs": SimpleNamespace(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=SimpleNamespace(get=lambda: False)),
        "_pd_prefill_skips_mamba_spec_state": lambda: False, "logger": SimpleNamespace(warning=lambda *a: None),
    }
    for constant in ("MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO", "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
                     "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER"):
        _definition_from(source, constant, names)
    _definition_from(root / "sglang/srt/mem_cache/allocation_sizing.py", "get_mamba_tracking_slots", names)
    handle = _method_from(source, "KVCacheConfigurator", "_handle_max_mamba_cache", names)
    ratio = _method_from(source, "KVCacheConfigurator", "_calculate_mamba_ratio", names)
    resolve = _method_from(source, "KVCacheConfigurator", "resolve_max_num_reqs", names)
    params = SimpleNamespace(layers=list(range(hf["num_hidden_layers"])), mamba_cache_per_req=_sglang_state(mu, name, 1))
    kvc = SimpleNamespace(mambaish_config=SimpleNamespace(mamba2_cache_params=params), pp_size=1,
                          fused_entry_bytes=lambda pool: None, spec_algorithm=SimpleNamespace(is_none=lambda: True),
                          hybrid_gdn_config=None, hybrid_kda_config=None, extra_mamba_cache_bytes_per_req=0,
                          attn_dp_size=1, model_config=SimpleNamespace(context_len=2048))
    kvc._calculate_mamba_ratio = lambda: ratio(kvc)
    handle(kvc, float(budget_gib))
    return schedule.max_mamba_cache_size + 1, resolve(kvc, 2048)


def _our_sizing(name: str, budget_gib: int, extra: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, int]:
    from app.cli import main

    assert main(["plan", "--model", str(CORPUS / f"{name}.json"), "--gpu", "H200", "--kv-cache-memory",
                 f"{budget_gib}GiB", "--json", *extra]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["max_total_num_tokens"] == 2048
    return d["plan"]["state_pool"]["num_slots"], d["max_running_requests"]


@pytest.mark.parametrize("budget_gib", (8, 37, 60))
@pytest.mark.parametrize("name", sorted(SIZING))
def test_state_slots_and_running_requests_equal_sglangs_own_code(sglang_mamba_utils: ModuleType, name: str,
                                                                 budget_gib: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert _our_sizing(name, budget_gib, [], capsys) == _sglang_sizing(sglang_mamba_utils, name, budget_gib)


@pytest.mark.parametrize("running", (1, 8, 50))
@pytest.mark.parametrize("name", sorted(SIZING))
def test_without_the_radix_cache_the_running_requests_fix_the_slots_as_sglang_does(
        sglang_mamba_utils: ModuleType, name: str, running: int, capsys: pytest.CaptureFixture[str]) -> None:
    """--disable-radix-cache --max-running-requests N: N state slots (plus padding), one a request, whatever the
    budget's share (SGLang 0.5.23's second branch of _handle_max_mamba_cache)."""
    flags = ["--disable-radix-cache", "--max-running-requests", str(running)]
    ours = _our_sizing(name, 37, flags, capsys)
    assert ours == _sglang_sizing(sglang_mamba_utils, name, 37, disable_radix_cache=True,
                                  max_running_requests=running) == (running + 1, running)
