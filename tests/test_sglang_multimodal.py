"""SGLang 0.5.23's multimodal memory rules (kvcache.engines.sglang_multimodal): which models have their multimodal
side on, the cut to a derived mem_fraction_static, the 100 MiB reserve and the prefill graphs they lose.

Numbers by hand from SGLang 0.5.23's formulas (arg_groups/memory_hook.py, mem_cache/kv_cache_configurator.py) and
the public configs in tests/model_corpus; where the reference tree is present (KVCACHE_REFERENCE_SRC), SGLang's
own adjust_mem_fraction_for_vlm and its architecture lists are read from it and compared.
"""

from __future__ import annotations

import ast
import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch

from app.cli import main
from kvcache.byte_units import MiB
from kvcache.engines import engine_rules
from kvcache.engines.sglang import SGLANG
from kvcache.engines.sglang_multimodal import (
    BREAKABLE_PREFILL_GRAPH_ARCHITECTURES, MIMO_V2_MULTIMODAL_ARCHITECTURES, MULTIMODAL_ARCHITECTURES,
    MULTIMODAL_OFF_BY_DEFAULT, VLM_CACHE_RESERVE_MIB, vit_factor,
)
from kvcache.errors import ConfigError, ModelConfigFieldError, WeightsLeaveNoRoomError
from kvcache.inputs.cards import card_named
from kvcache.inputs.dtypes import BFLOAT16, KV_CACHE_DTYPES
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.sizing.memory_budget import headroom_bytes
from kvcache.models.hf_config import model_config_from_hf
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory
from reference_sources import reference_src_holding

CORPUS = Path(__file__).with_name("model_corpus")
QWEN35, MISTRAL, GEMMA3, SCOUT = ("Qwen3.5-35B-A3B", "Mistral-Small-3.1-24B-Instruct-2503", "gemma-3-27b-it",
                                  "Llama-4-Scout-17B-16E-Instruct")
# The ViT factor by hand: 0.95 x clamp(1 - 0.1 x (layers x hidden^2 / (24 x 1024^2) - 1), 0.8, 1.05)
QWEN35_FACTOR = Fraction(95, 100) * (1 - Fraction(1, 10) * (Fraction(1152 ** 2, 1024 ** 2) - 1))  # depth is not read
MISTRAL_FACTOR = Fraction(95, 100)  # Pixtral: 24 layers x 1024, the baseline
GEMMA3_FACTOR = Fraction(95, 100) * (1 - Fraction(1, 10) * (Fraction(27 * 1152 ** 2, 24 * 1024 ** 2) - 1))


def raw(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / f"{name}.json").read_text())


def corpus(name: str) -> ModelConfig:
    return model_config_from_hf(raw(name), name=name)


def plan(capsys: pytest.CaptureFixture[str], name: str, *flags: str) -> dict[str, Any]:
    assert main(["plan", "--model", str(CORPUS / f"{name}.json"), *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def by_hand_budget(report: dict[str, Any], fraction: Fraction, reserve: int) -> int:
    """free after load - round(free before load x (1 - fraction)) - reserve, exactly."""
    return report["free_after_load_bytes"] - round(report["free_before_load_bytes"] * (1 - fraction)) - reserve


# ---- the numbers of issue 24 ----------------------------------------------------------------------------

def test_qwen3_5_35b_a3b_on_an_h200_keeps_sglangs_vision_fraction_and_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    assert QWEN35_FACTOR == Fraction(11837, 12800)  # 0.924765625
    r = plan(capsys, QWEN35, "--gpu", "H200")
    fraction = Fraction(903, 1000) * QWEN35_FACTOR  # Qwen3.5-MoE keeps its prefill graphs: the text rule's 0.903
    assert r["mem_fraction_static"] == float(fraction) and round(r["mem_fraction_static"], 3) == 0.835
    assert r["budget_bytes"] == by_hand_budget(r, fraction, 100 * MiB)
    m = r["multimodal"]
    assert (m["on"], m["cut_by"], m["fraction_before_cut"], m["prefill_cuda_graphs"]) == (True, "factor", 0.903, True)
    assert m["reserve_bytes"] == 104_857_600
    assert m["kept_by_fraction_bytes"] == (round(r["free_before_load_bytes"] * (1 - fraction))
                                           - round(r["free_before_load_bytes"] * Fraction(97, 1000)))
    # SGLang's own count, 1,401,208 (issue 24): the budget less the 400 state slots, in 20,480-byte tokens; this
    # project also charges the request table and the allocator's index to the budget, which leaves 1,394,837
    assert r["plan"]["state_pool"]["num_slots"] == 400 and r["buffers"]["state"] == 400 * 64_389_120
    assert (r["budget_bytes"] - r["buffers"]["state"]) // r["bytes_per_token"] == 1_401_208
    assert r["max_total_num_tokens"] == 1_394_837
    # text only: the text rule's fraction, no reserve, and no vision tower loaded (1,655,607 tokens with it)
    text = plan(capsys, QWEN35, "--gpu", "H200", "--language-model-only")
    assert (text["mem_fraction_static"], text["max_total_num_tokens"]) == (0.903, 1_677_310)
    assert text["multimodal"]["on"] is False and text["multimodal"]["reserve_bytes"] == 0
    assert (text["vision_weights"], r["vision_weights"]) == ("not_loaded", "counted")
    assert text["weights_bytes"] < r["weights_bytes"]


def test_mistral_small_3_1_on_an_h100_loses_its_prefill_graphs_then_is_cut_by_0_95(
        capsys: pytest.CaptureFixture[str]) -> None:
    card_mib = card_named("H100-80GB").device_capacity_bytes // MiB  # nvidia-smi's, as SGLang reads it
    assert card_mib == 81559
    # no prefill CUDA graphs (Mistral3 is off SGLang's breakable list): 512 + 1.5 x 8192 + 128 + 2 x 256 MiB
    before = round(Fraction(card_mib - (512 + 12288 + 128 + 512), card_mib), 3)
    assert before == Fraction(835, 1000)  # 0.830 with the 58 prefill graphs' 464 MiB
    r = plan(capsys, MISTRAL, "--gpu", "H100-80GB", "--context-length", "32768")
    assert r["mem_fraction_static"] == float(before * MISTRAL_FACTOR) == 0.79325
    assert r["budget_bytes"] == by_hand_budget(r, before * MISTRAL_FACTOR, 100 * MiB)
    assert (r["multimodal"]["fraction_before_cut"], r["multimodal"]["prefill_cuda_graphs"]) == (0.835, False)
    assert r["multimodal"]["fraction_factor"] == 0.95
    assert r["measured_prediction"] is None  # the measured step runs no vision encoder: the fraction keeps its headroom


# ---- when the multimodal side is on -------------------------------------------------------------------

@pytest.mark.parametrize("name, flags, on", [
    (QWEN35, {}, True),
    (MISTRAL, {}, True),
    (GEMMA3, {}, False),  # off by default in SGLang 0.5.23
    (GEMMA3, {"enable_multimodal": True}, True),
    (SCOUT, {}, False),
    (SCOUT, {"enable_multimodal": True}, True),
    (QWEN35, {"language_model_only": True}, False),
    (QWEN35, {"enable_multimodal": False}, False),  # a settings file may say false
    ("qwen3-14b", {"enable_multimodal": True}, False),  # nothing happens for a text model
])
def test_which_models_have_their_multimodal_side_on(name: str, flags: dict[str, Any], on: bool) -> None:
    rule = SGLANG.multimodal(corpus(name), enable_multimodal=flags.get("enable_multimodal"),
                             language_model_only=flags.get("language_model_only", False))
    assert rule.on is on
    assert rule.multimodal_model is (name != "qwen3-14b")
    assert rule.reserve_bytes == (VLM_CACHE_RESERVE_MIB * MiB if on else 0)


def test_a_checkpoint_that_declares_itself_language_model_only_is_text() -> None:
    hf = raw(QWEN35) | {"language_model_only": True}
    rule = SGLANG.multimodal(model_config_from_hf(hf, name="lm-only"), enable_multimodal=None,
                             language_model_only=False)
    assert (rule.on, rule.why) == (False, "config.json's language_model_only")


def test_a_text_subconfig_makes_a_wrapper_multimodal_and_mimo_v2_needs_both_towers() -> None:
    qwen = raw(QWEN35) | {"architectures": ["SomeWrapperForConditionalGeneration"]}
    assert SGLANG.multimodal(model_config_from_hf(qwen, name="wrapper"), enable_multimodal=None,
                             language_model_only=False).on
    model = corpus("qwen3-14b")
    vision_only = {"architectures": ["MiMoV2ForCausalLM"], "vision_config": {}}
    mimo = msgspec.structs.replace(model, hf_config=vision_only)
    assert not SGLANG.multimodal(mimo, enable_multimodal=None, language_model_only=False).on
    both = msgspec.structs.replace(model, hf_config=vision_only | {"audio_config": {}})
    assert SGLANG.multimodal(both, enable_multimodal=None, language_model_only=False).on


# ---- which vision towers SGLang builds -------------------------------------------------------------------

def _parameters(model: ModelConfig) -> int:
    return sum(spec.numel for spec in model.weights.parameter_specs())


# Qwen3.5-35B-A3B's tower as counted (kvcache.models.vision): patch embed 1152 x (3 x 2 x 16 x 16) + bias; 27 layers
# of two biased norms, biased q/k/v/o 1152 x 1152 and a biased 1152 -> 4304 -> 1152 MLP; a final norm; the
# projector 1152 -> 2048 with bias
QWEN35_TOWER = (1152 * 1536 + 1152 + 27 * (4 * 1152 + 4 * 1152 * 1152 + 4 * 1152 + 2 * 1152 * 4304 + 4304 + 1152)
                + 2 * 1152 + 2048 * 1152 + 2048)


@pytest.mark.parametrize("flags, loaded", [
    ({}, True), ({"language_model_only": True}, False), ({"enable_multimodal": True}, True),
])
def test_text_only_qwen3_5_loads_no_vision_tower(flags: dict[str, Any], loaded: bool) -> None:
    model = corpus(QWEN35)
    served = SGLANG.served_model(model, enable_multimodal=flags.get("enable_multimodal"),
                                 language_model_only=flags.get("language_model_only", False))
    assert _parameters(model) - _parameters(served) == (0 if loaded else QWEN35_TOWER)
    assert served.vision_weights == ("counted" if loaded else "not_loaded")


def test_llama4_builds_its_tower_only_with_enable_multimodal_and_mistral3_always() -> None:
    scout = raw(SCOUT)
    scout["vision_config"] = raw(MISTRAL)["vision_config"]  # the corpus config leaves the tower out
    model = model_config_from_hf(scout, name="scout-with-vision")
    assert SGLANG.served_model(model, enable_multimodal=None, language_model_only=False).vision_weights == "not_loaded"
    assert SGLANG.served_model(model, enable_multimodal=True, language_model_only=False).vision_weights == "counted"
    mistral = corpus(MISTRAL)  # Mistral3's model class builds its tower even when serving text
    assert SGLANG.served_model(mistral, enable_multimodal=None, language_model_only=True) is mistral
    assert engine_rules("vllm").served_model(model, enable_multimodal=None, language_model_only=False) is model


# ---- the ViT-size factor ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, factor", [(QWEN35, QWEN35_FACTOR), (MISTRAL, MISTRAL_FACTOR), (GEMMA3, GEMMA3_FACTOR)])
def test_the_vit_factor_of_the_corpus_models(name: str, factor: Fraction) -> None:
    assert vit_factor(corpus(name)) == factor


@pytest.mark.parametrize("vision, factor", [
    ({"num_hidden_layers": 48, "hidden_size": 4096}, Fraction(95, 100) * Fraction(4, 5)),  # clamped below
    ({"num_hidden_layers": 1, "hidden_size": 64}, Fraction(95, 100) * Fraction(21, 20)),  # clamped above
    ({}, Fraction(95, 100)),  # SGLang reads 24 and 1024 where they are absent
])
def test_the_vit_factor_is_clamped_and_defaults_to_vit_l(vision: dict[str, int], factor: Fraction) -> None:
    hf = raw(MISTRAL) | {"vision_config": vision}
    assert vit_factor(model_config_from_hf(hf, name="vit")) == factor


def test_a_bad_vision_field_is_refused_naming_it() -> None:
    hf = raw(MISTRAL) | {"vision_config": {"num_hidden_layers": -3}}
    with pytest.raises(ModelConfigFieldError, match="vision_config.num_hidden_layers"):
        vit_factor(model_config_from_hf(hf, name="bad"))


def test_without_vision_config_the_fraction_is_not_cut_but_the_reserve_and_graph_rule_hold(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-4 Scout's corpus config has no vision_config: with --enable-multimodal SGLang's adjust returns the
    fraction as it is, but the 100 MiB reserve holds and Llama4 (off the breakable list) loses its prefill graphs."""
    text = plan(capsys, SCOUT, "--gpu", "H200", "--tp-size", "4", "--context-length", "65536")
    mm = plan(capsys, SCOUT, "--gpu", "H200", "--tp-size", "4", "--context-length", "65536", "--enable-multimodal")
    assert text["multimodal"]["on"] is False and text["multimodal"]["multimodal_model"] is True
    assert mm["multimodal"]["cut_by"] is None and mm["multimodal"]["fraction_factor"] is None
    card_mib = card_named("H200").total_bytes // MiB
    assert mm["mem_fraction_static"] == float(round(Fraction(card_mib - (512 + 12288 + 512 + 1024), card_mib), 3))
    assert mm["budget_bytes"] == by_hand_budget(mm, Fraction(repr(mm["mem_fraction_static"])), 100 * MiB)


# ---- the flags and the other knobs ---------------------------------------------------------------------

def test_a_given_fraction_is_not_cut_but_the_reserve_comes_out(capsys: pytest.CaptureFixture[str]) -> None:
    r = plan(capsys, QWEN35, "--gpu", "H200", "--mem-fraction-static", "0.8")
    assert r["mem_fraction_static"] == 0.8 and r["multimodal"]["cut_by"] is None
    assert r["budget_bytes"] == by_hand_budget(r, Fraction(4, 5), 100 * MiB)


def test_kv_cache_memory_is_the_budget_itself(capsys: pytest.CaptureFixture[str]) -> None:
    r = plan(capsys, QWEN35, "--gpu", "H200", "--kv-cache-memory", "40GiB")
    assert r["budget_bytes"] == 40 << 30 and r["multimodal"]["reserve_bytes"] == 0


def test_the_two_flags_contradict_and_vllm_refuses_them() -> None:
    with pytest.raises(ConfigError, match="--enable-multimodal and --language-model-only contradict each other"):
        ServerArgs.from_mapping({"enable_multimodal": True, "language_model_only": True})
    with pytest.raises(ConfigError, match=r"--language-model-only \(vLLM has it too, not modelled here"):
        ServerArgs.from_mapping({"engine": "vllm", "language_model_only": True})


def test_vllm_plans_a_multimodal_model_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.34.0 has no fixed cut: it measures its encoder in the profile run; the dry run's runtime estimate
    keeps the text rule's reserve (prefill graphs included) for it."""
    assert main(["plan", "--model", str(CORPUS / f"{QWEN35}.json"), "--gpu", "H200", "--engine", "vllm", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["vllm"]
    assert answer["estimated_runtime_bytes"] == 13904 * MiB  # 512 + 1.5 x 8192 + 128 + 2 x 256 + 58 x 8 MiB


def test_the_text_report_says_what_the_cut_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(CORPUS / f"{MISTRAL}.json"), "--gpu", "H100-80GB",
                 "--context-length", "32768"]) == 0
    out = capsys.readouterr().out
    assert "multimodal          on: SGLang 0.5.23 serves Mistral3ForConditionalGeneration's multimodal side" in out
    assert "mem_fraction_static 0.835 x 0.95 (0.95 x the ViT-size factor) = 0.79325: keeps" in out
    assert "0.10 GiB (104,857,600 B) of the budget kept for the multimodal embedding cache" in out
    assert "no prefill CUDA graphs" in out


def _cuda_sizing(name: str, **settings: Any) -> WorkerSizing:
    model = corpus(name)
    return WorkerSizing(settings=SizingSettings(context_length=8192, **settings), model_config=model,
                        parallel_state=ParallelState(), model_dtype=BFLOAT16,
                        kv_cache_dtype=KV_CACHE_DTYPES["bfloat16"], device_type="cuda", engine=engine_rules("sglang"))


def test_with_the_post_capture_resize_the_cut_is_8_gib_of_the_card_and_headroom_is_not_measured() -> None:
    total = card_named("H100-80GB").device_capacity_bytes  # nvidia-smi's, as SGLang's fraction reads it
    resized = _cuda_sizing(MISTRAL, enable_post_capture_kv_resize=True, kv_headroom="fraction")
    assert resized.post_capture_resize().active
    before = round(Fraction(81559 - 1536 - 128, 81559), 3)  # SGLang's post-capture reserve: 1536 + tp*pp/8 GiB
    assert resized.mem_fraction_static(total) == float(before - Fraction(8192, 81559))
    measured = _cuda_sizing(MISTRAL)  # --kv-headroom auto would measure a text model
    assert not measured.post_capture_resize().active and "no vision encoder" in measured.post_capture_resize().reason
    assert _cuda_sizing(MISTRAL, language_model_only=True).post_capture_resize().measured
    both = _cuda_sizing(MISTRAL, enable_post_capture_kv_resize=True)
    assert both.post_capture_resize().active and not both.post_capture_resize().measured


def test_weights_that_leave_nothing_name_the_reserve() -> None:
    sizing = _cuda_sizing(MISTRAL, mem_fraction_static=0.5)
    free_before = 80 * 1024 * MiB
    keep = headroom_bytes(free_before, 0.5)
    with pytest.raises(WeightsLeaveNoRoomError, match=r"keeps .* free and 0\.10 GiB \(104,857,600 B\) for buffers allocated after it"):
        sizing.budget(WorkerMemory(total_bytes=free_before, free_before_load=free_before,
                                   free_after_load=keep + 50 * MiB))


# ---- against SGLang 0.5.23's own code ---------------------------------------------------------------------

def _sglang_module_ast(relative: str) -> ast.Module:
    root = reference_src_holding(relative, "SGLang")
    return ast.parse((root / relative).read_text())


def _list_assigned(tree: ast.AST, name: str, env: dict[str, Any] | None = None) -> list[str]:
    """The list literal assigned to `name` anywhere in `tree` (names in it resolved from `env`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return list(eval(compile(ast.Expression(node.value), name, "eval"), dict(env or {})))  # noqa: S307
    raise AssertionError(f"{name} is not assigned in SGLang's source")


def test_our_architecture_lists_are_sglangs() -> None:
    tree = _sglang_module_ast("sglang/srt/configs/model_config.py")
    mimo = tuple(_list_assigned(tree, "MIMO_V2_MULTIMODAL_ARCHS"))
    assert set(mimo) == MIMO_V2_MULTIMODAL_ARCHITECTURES
    assert set(_list_assigned(tree, "multimodal_model_archs", {"MIMO_V2_MULTIMODAL_ARCHS": mimo})) == \
        MULTIMODAL_ARCHITECTURES
    assert set(_list_assigned(tree, "multimodal_breakable_cuda_graph_supported_model_archs")) == \
        BREAKABLE_PREFILL_GRAPH_ARCHITECTURES
    assert set(_list_assigned(tree, "mm_disabled_models")) == MULTIMODAL_OFF_BY_DEFAULT


def test_the_reserve_is_sglangs_default() -> None:
    tree = _sglang_module_ast("sglang/srt/environ.py")
    found = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "SGLANG_VLM_CACHE_SIZE_MB" for t in node.targets)]
    assert len(found) == 1 and isinstance(found[0], ast.Call) and ast.literal_eval(found[0].args[0]) == VLM_CACHE_RESERVE_MIB


@pytest.mark.parametrize("name", [QWEN35, MISTRAL, GEMMA3, "Qwen2-VL-7B-Instruct", "Qwen3-VL-8B-Instruct"])
@pytest.mark.parametrize("fraction", [0.903, 0.835, 0.83])
def test_sglangs_own_adjust_mem_fraction_for_vlm_gives_our_fraction(name: str, fraction: float) -> None:
    tree = _sglang_module_ast("sglang/srt/arg_groups/memory_hook.py")
    (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "adjust_mem_fraction_for_vlm"]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), "memory_hook.py", "exec"), namespace)  # noqa: S102
    vision = raw(name)["vision_config"]
    model_config = SimpleNamespace(hf_config=SimpleNamespace(vision_config=SimpleNamespace(**vision)))
    theirs = namespace["adjust_mem_fraction_for_vlm"](fraction, model_config, False, 143155)
    rule = SGLANG.multimodal(corpus(name), enable_multimodal=True, language_model_only=False)
    assert rule.cut_fraction(fraction, 143155 * MiB, post_capture=False) == pytest.approx(theirs, rel=1e-15)
    after_capture = namespace["adjust_mem_fraction_for_vlm"](fraction, model_config, True, 143155)
    assert rule.cut_fraction(fraction, 143155 * MiB, post_capture=True) == pytest.approx(after_capture, rel=1e-15)
