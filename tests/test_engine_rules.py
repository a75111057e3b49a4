"""Engine rules (kvcache.engines): one field picks the engine a plan is for; the report names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import kvcache.models
from app.cli import main
from kvcache.engines import ENGINES, engine_rules
from kvcache.engines.sglang import SGLANG
from kvcache.inputs.dtypes import BFLOAT16, KV_CACHE_DTYPES
from kvcache.inputs.parallel import ParallelState
from kvcache.models.hf_config import model_config_from_hf
from kvcache.sizing.pool_layout import worker_cache_layout
from kvcache.errors import ConfigError
from kvcache.inputs.server_args import ServerArgs


def test_sglang_0_5_23_is_the_default_engine() -> None:
    assert ServerArgs().engine == "sglang"
    rules = engine_rules("sglang")
    assert (rules.name, rules.version, rules.label) == ("sglang", "0.5.23", "SGLang 0.5.23")


def test_every_engine_choice_of_the_flag_has_an_entry() -> None:
    assert set(ENGINES) == {"sglang", "vllm"}


def test_the_report_names_the_engine_and_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200"]) == 0
    assert "engine              sglang 0.5.23" in capsys.readouterr().out
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["engine"], report["engine_version"]) == ("sglang", "0.5.23")


def test_vllm_rules_answer_with_their_own_blocks_and_build_no_pools(capsys: pytest.CaptureFixture[str]) -> None:
    rules = engine_rules("vllm")
    assert (rules.name, rules.version, rules.label) == ("vllm", "0.34.0", "vLLM 0.34.0")
    with pytest.raises(ConfigError, match="^--engine vllm plans vLLM's own blocks, not this engine's pools"):
        rules.plan(None)  # type: ignore[arg-type]
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--engine", "vllm"]) == 0
    assert "engine              vllm 0.34.0" in capsys.readouterr().out


# ---- SGLang 0.5.23: separate sliding-window pools ------------------------------------------------

CORPUS = Path(__file__).with_name("model_corpus")
PRESETS = Path(kvcache.models.__file__).with_name("presets")
REFUSED = {"DeepSeek-V4-Flash", "gemma-4-26B-A4B"}  # their caches are not sized yet (tests/test_model_corpus.py)
CONFIGS = {p.stem: p for d in (CORPUS, PRESETS) for p in sorted(d.glob("*.json")) if p.stem not in REFUSED}
# typed in from SGLang 0.5.23's is_hybrid_swa_model set (configs/model_config.py): GptOssForCausalLM (via
# SWA_SINK_ARCHS) and Llama4ForConditionalGeneration; of the corpus, Gemma4ForConditionalGeneration and
# DeepseekV4ForCausalLM are listed too, but their configs are refused before any pool is decided
HYBRID_SWA = {"gpt-oss-120b", "gpt-oss-20b", "Llama-4-Scout-17B-16E-Instruct", "Llama-4-Maverick-17B-128E-Instruct"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_window_pools_only_for_sglangs_hybrid_swa_architectures(name: str) -> None:
    assert len(CONFIGS) >= 60
    model = model_config_from_hf(CONFIGS[name], name=name)
    assert SGLANG.window_pools(model, "auto").separate == (name.removesuffix("-transformers5") in HYBRID_SWA)
    assert SGLANG.window_pools(model, "enable").separate and not SGLANG.window_pools(model, "disable").separate


def test_the_corpus_holds_sliding_models_on_both_sides_of_the_rule() -> None:
    sliding = {n for n, p in CONFIGS.items() if "sliding_attention" in model_config_from_hf(p, name=n).layer_kinds}
    assert {"gemma-2-9b-it", "gemma-3-27b-it", "Mistral-7B-v0.1", "Phi-3-mini-4k-instruct"} <= sliding - HYBRID_SWA
    assert {"gpt-oss-20b", "gpt-oss-120b"} <= sliding & HYBRID_SWA


def test_a_config_may_opt_in_as_sglang_reads_is_hybrid_swa() -> None:
    raw = json.loads(CONFIGS["Mistral-7B-v0.1"].read_text()) | {"is_hybrid_swa": True}
    assert SGLANG.window_pools(model_config_from_hf(raw, name="opted-in"), "auto").separate


def _plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("model", "sglang_tokens", "ours", "window_pools"), [
    # SGLang 0.5.23 on an H200 allocates 338,252 and 157,508 tokens in one full pool; the project also charges
    # the request table in the budget (4,097 rows x 8,192 and 2,049 rows x 131,072 int32), a little less
    ("gemma-2-9b-it", 338_252, 337_826, 375_318),
    (str(CORPUS / "gemma-3-27b-it.json"), 157_508, 155_380, 186_679),
])
def test_gemma_2_and_3_plan_sglangs_one_full_pool_by_default(model: str, sglang_tokens: int, ours: int,
                                                              window_pools: int, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(["--model", model, "--gpu", "H200"], capsys)
    assert [(p["name"], p["kind"]) for p in plan["plan"]["kv_pools"]] == [("full", "full")]
    assert plan["max_total_num_tokens"] == ours and 0 < sglang_tokens - ours < 0.015 * sglang_tokens
    assert plan["max_total_num_tokens"] * (sglang_tokens - ours) < plan["buffers"]["req_to_token"] * sglang_tokens
    split = _plan(["--model", model, "--gpu", "H200", "--enable-hybrid-swa-memory"], capsys)
    assert [p["kind"] for p in split["plan"]["kv_pools"]] == ["full", "swa"]
    assert split["max_total_num_tokens"] == window_pools


def test_mistral_and_phi3_windows_are_full_pools_and_gpt_oss_keeps_its_pair(capsys: pytest.CaptureFixture[str]) -> None:
    for model in ("Mistral-7B-v0.1", str(CORPUS / "Phi-3-mini-4k-instruct.json")):
        assert [p["kind"] for p in _plan(["--model", model, "--gpu", "H200"], capsys)["plan"]["kv_pools"]] == ["full"]
    assert [p["kind"] for p in _plan(["--model", "gpt-oss-20b", "--gpu", "H200"], capsys)["plan"]["kv_pools"]] == [
        "full", "swa"]
    one = _plan(["--model", "gpt-oss-20b", "--gpu", "H200", "--disable-hybrid-swa-memory"], capsys)
    assert [p["kind"] for p in one["plan"]["kv_pools"]] == ["full"]


def test_both_switches_at_once_are_refused() -> None:
    with pytest.raises(ConfigError, match="--enable-hybrid-swa-memory and --disable-hybrid-swa-memory contradict"):
        ServerArgs.from_mapping({"enable_hybrid_swa_memory": True, "disable_hybrid_swa_memory": True})


def test_llama4_scouts_published_empty_no_rope_layers_means_every_fourth_layer_nope() -> None:
    raw = json.loads((CORPUS / "Llama-4-Scout-17B-16E-Instruct.json").read_text())
    raw.setdefault("text_config", raw)["no_rope_layers"] = []
    model = model_config_from_hf(raw, name="scout-published")
    assert model.layer_kinds == tuple("full_attention" if (i + 1) % 4 == 0 else "chunked_attention" for i in range(48))
    layout = worker_cache_layout(model_config=model, parallel_state=ParallelState(),
                                 kv_cache_dtype=KV_CACHE_DTYPES["bfloat16"], model_dtype=BFLOAT16)
    assert sum(g.bytes_per_token for g in layout.kv_groups) == 48 * 8 * 256 * 2  # 196,608: SGLang 0.5.23's


@pytest.mark.parametrize(("page", "algorithm", "steps", "topk", "tokens", "extra"), [
    (1, "none", 0, 0, 0, 4),  # SGLang's fixed 4 slots past the context
    (16, "none", 0, 0, 0, 4),
    (1, "EAGLE", 3, 1, 4, 4 + 4),  # a chain: plus the 4 tokens a verify step writes
    (16, "EAGLE", 3, 1, 4, 2 * 4 + 15),  # a step allocates max(3 x 1, 4) = 4, twice (overlap), plus a page less one
    # a tree at page 16: each of 4 branches takes ceil((15 + 5) / 16) = 2 pages, 2 x 16 x 4 = 128 slots a step
    (16, "EAGLE", 5, 4, 8, 2 * 128 + 15),
    (1, "EAGLE", 5, 4, 8, 4 + 8),  # page 1: max(5 x 4, 8) = 20 a step, but rows only need 4 + 8
])
def test_request_table_rows_are_as_wide_as_sglang_allocates_them(page: int, algorithm: str, steps: int, topk: int,
                                                                  tokens: int, extra: int) -> None:
    from kvcache.engines.vllm import VLLM
    from kvcache.inputs.sizing_settings import SizingSettings

    settings = SizingSettings(page_size=page, speculative_algorithm=algorithm, speculative_num_steps=steps,
                              speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens)
    assert SGLANG.request_table_width(4096, settings) == 4096 + extra
    assert VLLM.request_table_width(4096, settings) == 4096 + tokens  # vLLM has no such table: the base rule


def test_the_report_notes_a_config_form_sglang_refuses_and_vllm_rules_say_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvcache.engines.vllm import VLLM

    path = Path(__file__).with_name("model_corpus") / "Kimi-Linear-48B-A3B-Instruct-transformers5.json"
    assert main(["plan", "--model", str(path), "--gpu", "H200", "--tp-size", "4"]) == 0
    out = capsys.readouterr().out
    assert ("note: SGLang 0.5.23 refuses this config.json as written: there is no `linear_attn_config`, the only "
            "place its KimiLinearConfig reads the KDA layers and heads from: add it (kda_layers / full_attn_layers "
            "1-based, num_heads, head_dim, short_conv_kernel_size); the plan is what it would allocate for the same "
            "model once it loads\n") in out
    assert VLLM.config_notes(model_config_from_hf(path)) == ()
