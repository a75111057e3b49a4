"""The default mem_fraction_static on every card in the table equals SGLang 0.5.23's own code's (reference tree).

SGLang derives it in handle_gpu_memory_settings (srt/arg_groups/memory_hook.py) from the card as
get_device_memory_capacity reads it: nvidia-smi's memory.total in MiB. That function, its reserve_for_graph_mb and
cuda_graph_hook's generate_prefill_cuda_graph_batch_sizes are read from the reference tree and run with the
card's nvidia-smi total; their collaborators (the server-args view, the model config) are stubbed with the setup's
values. This project's fraction comes from the plan's budget for the same card (kvcache.inputs.cards), which picks
the total it reads. Before the card table held both totals, the H200 disagreed for the MLA configs (0.895 for 0.896).
"""

from __future__ import annotations

import ast
import copy
import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from containers import EngineContainer
from kvcache.inputs.cards import KNOWN_CARDS, card_named
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.memory_probe import probe_for_device
from kvcache.models.presets import load_model_config
from kvcache.sizing.worker_memory import WorkerMemory
from reference_sources import reference_src_holding

import torch

MEMORY_HOOK = "sglang/srt/arg_groups/memory_hook.py"
GRAPH_HOOK = "sglang/srt/arg_groups/cuda_graph_hook.py"
GRAPH_CONFIG = "sglang/srt/model_executor/cuda_graph_config.py"

# (preset, ServerArgs fields, SGLang's model_path, MLA, prefill graphs captured): the setups SGLang's rule branches on
SETUPS: dict[str, tuple[str, dict[str, Any], str, bool, bool]] = {
    "GQA": ("Llama-3.1-8B-Instruct", {}, "meta-llama/Llama-3.1-8B-Instruct", False, True),
    "MLA": ("DeepSeek-V2-Lite", {}, "deepseek-ai/DeepSeek-V2-Lite", True, True),
    "MLA TP 8": ("DeepSeek-V3", {"tp_size": 8}, "deepseek-ai/DeepSeek-V3", True, True),
    "Llama-2 (prefill graphs to 4,096)": ("Llama-2-7b-hf", {}, "meta-llama/Llama-2-7b-hf", False, True),
    "TP 4": ("Qwen3-8B", {"tp_size": 4}, "Qwen/Qwen3-8B", False, True),
    "PP 2 (no prefill graphs)": ("Llama-3.1-8B-Instruct", {"pp_size": 2}, "meta-llama/Llama-3.1-8B-Instruct", False,
                                 False),
    "no CUDA graphs": ("Qwen3-8B", {"disable_cuda_graph": True}, "Qwen/Qwen3-8B", False, False),
    "DP attention": ("DeepSeek-V3", {"tp_size": 8, "enable_dp_attention": True, "dp_size": 8},
                     "deepseek-ai/DeepSeek-V3", True, True),
    "16 running requests": ("Mistral-7B-v0.1", {"max_running_requests": 16}, "mistralai/Mistral-7B-v0.1", False,
                            True),
    "1,000 tokens": ("Qwen2.5-7B-Instruct", {"max_total_tokens": 1000}, "Qwen/Qwen2.5-7B-Instruct", False, True),
}


def _functions(relative: str, *names: str) -> list[ast.stmt]:
    """The named top-level functions and classes of a reference file, their own `from ... import` lines dropped
    (the namespace they run in provides those names)."""
    root = reference_src_holding(relative, "SGLang 0.5.23")
    tree = ast.parse((root / relative).read_text())
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    assert sorted(n.name for n in found) == sorted(names)
    for node in found:
        for parent in ast.walk(node):
            for field in ("body", "orelse"):
                block = getattr(parent, field, None)
                if isinstance(block, list):
                    setattr(parent, field, [s for s in block if not isinstance(s, ast.ImportFrom)] or [ast.Pass()])
    return found


def _sglang_fraction(card_mib: float) -> Any:
    """SGLang 0.5.23's handle_gpu_memory_settings for a card of `card_mib` (nvidia-smi's), as a function of a
    server-args namespace: it returns the mem_fraction_static SGLang declares."""
    namespace: dict[str, Any] = {
        "copy": copy, "logger": SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None),
        "resolving_view": lambda args: args, "resolved_view": lambda args: args,
        "declare_resolution": lambda args, source, **fields: [setattr(args, k, v) for k, v in fields.items()],
        "model_config_of": lambda args: SimpleNamespace(is_multimodal=False),
        "post_capture_kv_sizing_planned": lambda args: False, "use_mla_backend": lambda args: args.mla,
        "attn_dp_enabled_of": lambda view: view.enable_dp_attention,
        "get_platform": lambda: SimpleNamespace(is_xpu=False), "envs": None,
        "get_device_memory_capacity": lambda device: card_mib,
        "generate_decode_cuda_graph_batch_sizes": lambda args, max_bs: list(range(1, max_bs + 1)),
        "generate_cpu_graph_batch_sizes": lambda args: [1],
        "expand_multimodal_decode_graph_to_running_limit": lambda args, config, gpu_mem: None,  # Qwen3-VL only
        "_DEFAULT_PP_PREFILL_CUDA_GRAPH_MAX_TOKENS": 8192,
    }
    exec(_sglang_code(), namespace)  # noqa: S102
    return namespace


@functools.lru_cache(maxsize=1)
def _sglang_code() -> Any:
    """SGLang's functions the rule runs, compiled once."""
    body = (_functions(GRAPH_CONFIG, "Phase", "Backend") + _functions(GRAPH_HOOK, "generate_prefill_cuda_graph_batch_sizes")
            + _functions(MEMORY_HOOK, "handle_gpu_memory_settings", "reserve_for_graph_mb", "reserve_for_deepep_a2a_mb",
                         "adjust_mem_fraction_for_vlm"))
    return compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), MEMORY_HOOK, "exec")


def _server_args(namespace: dict[str, Any], setup: str) -> SimpleNamespace:
    """SGLang's server args for a setup, as its earlier hooks leave them (graph backends resolved)."""
    _, fields, model_path, mla, prefill_graphs = SETUPS[setup]
    backend = namespace["Backend"]
    graphs = not fields.get("disable_cuda_graph", False)
    return SimpleNamespace(
        device="cuda", model_path=model_path, mla=mla, mem_fraction_static=None, chunked_prefill_size=None,
        tp_size=fields.get("tp_size", 1), pp_size=fields.get("pp_size", 1),
        enable_dp_attention=fields.get("enable_dp_attention", False), attn_dp_size=fields.get("dp_size", 1),
        max_running_requests=fields.get("max_running_requests"), max_total_tokens=fields.get("max_total_tokens"),
        language_only=False, language_model_only=False, disaggregation_mode="null", max_prefill_tokens=16384,
        moe_a2a_backend="none", enable_symm_mem=False, torch_compile_max_bs=None, _cuda_graph_config_locked=set(),
        speculative_num_draft_tokens=None,
        cuda_graph_config=SimpleNamespace(
            decode=SimpleNamespace(backend=backend.FULL if graphs else backend.DISABLED, max_bs=None, bs=None),
            prefill=SimpleNamespace(backend=backend.BREAKABLE if prefill_graphs and graphs else backend.DISABLED,
                                    max_bs=None, bs=None)),
    )


def _ours(setup: str) -> dict[str, float]:
    """The plan's default fraction for this setup on each card: its budget for the memory the card's probe reads
    (the probe a dry run for that card gets)."""
    preset, fields, *_ = SETUPS[setup]
    args = ServerArgs(device="meta", kv_headroom="fraction", **fields)
    engine = EngineContainer(server_args=args, model_config=load_model_config(preset), card=card_named("H200"))
    try:
        sizing = engine.target.configurator().sizing
        out = {}
        for card in KNOWN_CARDS:
            probe = probe_for_device(torch.device("meta"), memory_limit=None, card=card_named(card))
            memory = WorkerMemory(total_bytes=probe.total_bytes(), free_before_load=probe.free_bytes(),
                                  free_after_load=probe.free_bytes(), reported_total_bytes=probe.device_capacity_bytes())
            fraction = sizing.budget(memory).mem_fraction_static
            assert fraction is not None
            out[card] = fraction
        return out
    finally:
        engine.shutdown_resources()


@pytest.mark.parametrize("setup", list(SETUPS))
def test_default_fractions_equal_sglangs_on_every_card(setup: str) -> None:
    sglang = {}
    for card, totals in KNOWN_CARDS.items():
        namespace = _sglang_fraction(float(totals.nvidia_smi_mib))
        args = _server_args(namespace, setup)
        namespace["handle_gpu_memory_settings"](args)
        sglang[card] = args.mem_fraction_static
    assert _ours(setup) == sglang


def test_the_h200_reads_nvidia_smis_total_for_the_fraction_and_cuda_mem_get_info_for_the_budget(
        capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V2-Lite on an H200: SGLang's reserve 512 + 1.5 x 8,192 + 128 + 2 x 256 + 1,536 (MLA) = 14,976 MiB of
    nvidia-smi's 143,771: 0.89583 -> 0.896 (cudaMemGetInfo's 143,155.875 MiB would give 0.89539 -> 0.895); the
    budget keeps round(free before load x 0.104) free, free before load being cudaMemGetInfo's total
    150,109,880,320 less the 650,969,088-B context."""
    from app.cli import main

    assert main(["plan", "--model", "DeepSeek-V2-Lite", "--gpu", "H200", "--kv-headroom", "fraction", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mem_fraction_static"] == 0.896
    assert report["device_capacity_bytes"] == 143_771 * 2**20 and report["total_memory_bytes"] == 150_109_880_320
    assert report["free_before_load_bytes"] == 150_109_880_320 - 650_969_088 and report["card_total_measured"] is True
    assert KNOWN_CARDS["H100-80GB"].cuda_total_bytes == 85_017_493_504  # measured on one, 2026-12-06
    assert KNOWN_CARDS["B200"].cuda_total_measured is False  # nvidia-smi's stands in until measured
