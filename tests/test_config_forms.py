"""Every config form users have: hybrids as transformers 5 saves them, and DBRX's nested sections.

transformers 5 (5.15 on) renames a hybrid's layer entries (mamba -> linear_attention, attention ->
full_attention) and writes Kimi-Linear without linear_attn_config; the corpus holds each model in both
forms (saved by transformers 5.19.0 itself, tests/model_corpus/SOURCES.md), and both must plan byte for byte alike.
A file that states a model both ways must state one model: any disagreement exits 2 with one line naming
the field. DBRX's cache and weights are checked by hand from databricks/dbrx-instruct's published config.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app.cli import main
from app.weights import count_parameters
from kvcache.errors import ModelConfigFieldError
from kvcache.inputs.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.models.hf_config import model_config_from_hf
from kvcache.models.model_config import ModelConfig
from kvcache.models.vision import without_vision_tower
from kvcache.sizing.layer_specs import model_layer_specs

CORPUS = Path(__file__).with_name("model_corpus")
# (the older form, the same model as transformers 5 writes it); the last four are multimodal wrappers, whose
# re-save gives the wrapper its class's own tie_word_embeddings (Mistral3Config: true, over the section's false)
PAIRS = [(name, f"{name}-transformers5") for name in (
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "granite-4.0-h-tiny-example", "Kimi-Linear-48B-A3B-Instruct",
    "dbrx-instruct", "Zamba2-2.7B",
    "Mistral-Small-3.1-24B-Instruct-2503", "Qwen3-VL-8B-Instruct", "Qwen3.5-35B-A3B", "gemma-3-27b-it")]
# Qwen2-VL's flat config comes back nested under text_config: the same plan, its weights named under language_model
PLAN_PAIRS = [*PAIRS, ("Qwen2-VL-7B-Instruct", "Qwen2-VL-7B-Instruct-transformers5")]
# transformers 5 writes Step3p7TextConfig's defaults beside the flat Step-3.7 digest: refused (SOURCES.md)
REFUSED_FORMS = CORPUS / "refused"


def raw(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / f"{name}.json").read_text())


def read(name: str) -> ModelConfig:
    return model_config_from_hf(CORPUS / f"{name}.json", name=name)


def specs(m: ModelConfig, tp: int) -> list[Any]:
    """The model's layer specs on one rank of tp, bf16 weights and KV, float32 SSM state."""
    dtype = resolve_model_dtype("auto", m.checkpoint_dtype)
    return model_layer_specs(m, ParallelState(tp_size=tp), resolve_kv_cache_dtype("auto", dtype), model_dtype=dtype)


def plan(path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The plan as --json prints it, less the model's name, the wall-clock timings and what the engine says of the
    file's form (SGLang refuses some transformers 5 forms: tests/test_config_forms_sglang.py)."""
    assert main(["plan", "--model", str(path), "--gpu", "H200", *argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return {k: v for k, v in out.items() if k not in ("model", "timings_s", "engine_notes")}


@pytest.mark.parametrize(("older", "newer"), PLAN_PAIRS, ids=[p[1] for p in PLAN_PAIRS])
@pytest.mark.parametrize("argv", [["--tp-size", "4", "--kv-cache-dtype", "fp8_e4m3"]], ids=["tp4-fp8"])
def test_the_transformers5_form_plans_byte_for_byte_like_the_older_form(
        older: str, newer: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    before, after = plan(CORPUS / f"{older}.json", argv, capsys), plan(CORPUS / f"{newer}.json", argv, capsys)
    assert after == before and before["max_total_num_tokens"] > 0


@pytest.mark.parametrize(("older", "newer"), PAIRS, ids=[p[1] for p in PAIRS])
def test_both_forms_are_one_description_of_the_model(older: str, newer: str) -> None:
    """Layer kinds, cache fields, weight layout: everything but the name and the raw dict it came from."""
    a, b = read(older), read(newer)
    assert msgspec.structs.replace(b, name=a.name, hf_config=a.hf_config) == a
    for tp in (1, 2):
        assert specs(b, tp) == specs(a, tp)
        assert b.weights.parameter_specs(tp_size=tp) == a.weights.parameter_specs(tp_size=tp)


def test_the_newer_forms_really_are_the_newer_spelling() -> None:
    """The pairs test something: the transformers 5 files carry none of the older fields they replace."""
    nemotron, granite, kimi, dbrx, zamba = (raw(p[1]) for p in PAIRS[:5])
    assert "hybrid_override_pattern" not in nemotron and "num_hidden_layers" not in nemotron
    assert set(nemotron["layers_block_type"]) == {"linear_attention", "full_attention", "moe"}
    assert set(granite["layer_types"]) == {"linear_attention", "full_attention"}
    assert not {"linear_attn_config", "first_k_dense_replace", "max_position_embeddings"} & set(kimi)
    assert read(PAIRS[2][1]).layer_kinds.count("kda") == 20
    assert set(zamba["layers_block_type"]) == {"linear_attention", "hybrid"}
    assert dbrx["num_key_value_heads"] == 8 and dbrx["ffn_config"]["hidden_size"] == 6144
    assert dbrx["rope_parameters"]["rope_theta"] != dbrx["attn_config"]["rope_theta"] == 500_000
    mistral, qwen2_vl = raw(f"{PAIRS[5][0]}-transformers5"), raw("Qwen2-VL-7B-Instruct-transformers5")
    assert "tie_word_embeddings" not in raw(PAIRS[5][0]) and mistral["tie_word_embeddings"] is True
    assert mistral["text_config"]["tie_word_embeddings"] is False
    assert "num_hidden_layers" not in qwen2_vl and qwen2_vl["text_config"]["model_type"] == "qwen2_vl_text"


def test_nemotron_h_lists_in_either_key_and_either_spelling_agree_with_the_pattern() -> None:
    hf = raw("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16-transformers5")
    legacy = {"linear_attention": "mamba", "full_attention": "attention"}
    both = hf | {"layer_types": [legacy.get(x, x) for x in hf["layers_block_type"]],
                 "hybrid_override_pattern": raw("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")["hybrid_override_pattern"]}
    assert model_config_from_hf(both, name="m").layer_kinds == read("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16").layer_kinds


_T5_NAMES = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_PRESETS = Path(__file__).resolve().parents[1] / "kvcache" / "models" / "presets"


def nemotron_as_transformers5_saves_it(hf: dict[str, Any]) -> dict[str, Any]:
    """A Nemotron-H config rewritten as transformers 5.19's NemotronHConfig saves it: letters and legacy
    names become layers_block_type / mtp_layers_block_type in the new names, the layer count is dropped."""
    out = {k: v for k, v in hf.items() if k not in ("hybrid_override_pattern", "mtp_hybrid_override_pattern",
                                                    "num_hidden_layers", "layer_types")}
    legacy = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
    for listed, letters in (("layers_block_type", "hybrid_override_pattern"),
                            ("mtp_layers_block_type", "mtp_hybrid_override_pattern")):
        pattern = hf.get(letters) or "".join(legacy[x] for x in hf.get(listed, ()))
        out[listed] = [_T5_NAMES[c] for c in pattern] or ["full_attention", "moe"]
    return out


@pytest.mark.parametrize(("path", "mtp"), [
    (CORPUS / "NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json", ("full_attention", "mlp")),  # MTP from its letters
    (CORPUS / "NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.json", ("full_attention", "mlp")),  # MTP from its list
    (_PRESETS / "Nemotron-H-56B-Base-8K.json", ()),  # squared-ReLU MLP layers (-), no MTP
], ids=lambda p: p.stem if isinstance(p, Path) else None)
def test_every_nemotron_h_reads_alike_in_transformers5_names(path: Path, mtp: tuple[str, ...]) -> None:
    """The target's layers and the MTP draft's (their cache kinds and weights) are the same model."""
    hf = json.loads(path.read_text())
    older = model_config_from_hf(hf, name="m")
    newer = model_config_from_hf(nemotron_as_transformers5_saves_it(hf), name="m")
    assert msgspec.structs.replace(newer, hf_config=older.hf_config) == older
    assert set(older.layer_kinds) >= {"mamba2", "full_attention"} and older.nextn_layer_kinds == mtp


def _with(name: str, section: str | None = None, **edit: Any) -> dict[str, Any]:
    hf = copy.deepcopy(raw(name))
    target = hf[section] if section else hf
    for key, value in edit.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return hf


NANO5, GRANITE5, KIMI5, KIMI = (PAIRS[0][1], PAIRS[1][1], PAIRS[2][1], PAIRS[2][0])
MISTRAL5, QWEN35_5 = PAIRS[5][1], PAIRS[7][1]
_NANO_TYPES = raw(NANO5)["layers_block_type"]
_KIMI_TYPES = raw(KIMI5)["layer_types"]
CONTRADICTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("Nemotron-H list against its letters", _with(NANO5, hybrid_override_pattern="M" * 52),
     "field 'hybrid_override_pattern' is 'MMMM"),
    ("Nemotron-H two lists that disagree", _with(NANO5, layer_types=["mamba"] * 52),
     "field 'layer_types' is ['mamba', 'mamba'"),
    ("Nemotron-H an entry of neither spelling", _with(NANO5, layers_block_type=["sliding_attention"] + _NANO_TYPES[1:]),
     "field 'layers_block_type[0]' is 'sliding_attention'; expected one of mamba, attention, mlp, moe, "
     "linear_attention, full_attention"),
    ("Nemotron-H an MTP list of another type", _with(NANO5, num_nextn_predict_layers=1,
                                                     mtp_layers_block_type=["linear_attention", "moe"]),
     "field 'mtp_layers_block_type' is ['linear_attention', 'moe']; expected only attention and moe layers"),
    ("Granite two lists that disagree", _with(GRANITE5, layers_block_type=["mamba"] * 8),
     "field 'layers_block_type' is ['mamba', 'mamba'"),
    ("Granite an entry of neither spelling", _with(GRANITE5, layer_types=["moe"] * 8),
     "field 'layer_types[0]' is 'moe'; expected one of mamba, attention, linear_attention, full_attention"),
    ("Zamba-2 a block of neither spelling",
     _with("Zamba2-2.7B-transformers5", layers_block_type=["full_attention"] * 54),
     "field 'layers_block_type[0]' is 'full_attention'; expected one of mamba, hybrid, linear_attention"),
    ("Kimi layer_types against linear_attn_config", _with(KIMI, layer_types=["linear_attention"] * 27),
     "field 'layer_types' is ['linear_attention'"),
    ("Kimi flat heads against linear_attn_config", _with(KIMI, linear_num_heads=16),
     "field 'linear_num_heads' is 16; expected linear_attn_config.num_heads (32), when both are given"),
    ("Kimi transformers 5 form without its KDA heads", _with(KIMI5, linear_num_heads=None),
     "config.json has no 'linear_num_heads'"),
    ("Kimi with neither form of its layers", _with(KIMI5, layer_types=None),
     "field 'linear_attn_config' is None; expected an object listing kda_layers"),
    ("Kimi mlp_layer_types against first_k_dense_replace", _with(KIMI5, first_k_dense_replace=2),
     "field 'mlp_layer_types' is ['dense', 'sparse'"),
    ("Kimi mlp_layer_types all dense", _with(KIMI5, mlp_layer_types=["dense"] * 27),
     "expected at least one 'sparse' of the 27 layers"),
    ("Kimi an MLP entry of neither kind", _with(KIMI5, mlp_layer_types=["moe"] * 27),
     "field 'mlp_layer_types[0]' is 'moe'; expected one of dense, sparse"),
    ("Kimi-K3's gated MLA output", _with(KIMI5, mla_use_output_gate=True),
     "field 'mla_use_output_gate' is True; expected false"),
    ("DBRX d_model against hidden_size", _with("dbrx-instruct", hidden_size=4096),
     "field 'hidden_size' is 4096; expected the value 'd_model' gives (6144)"),
    ("DBRX KV heads that do not split its heads", _with("dbrx-instruct", "attn_config", kv_n_heads=7),
     "field 'attn_config.kv_n_heads' is 7; expected a divisor of n_heads (48)"),
    ("DBRX top-k above its experts", _with("dbrx-instruct", "ffn_config", moe_top_k=17),
     "field 'ffn_config.moe_top_k' is 17; expected a positive integer (at most 16)"),
    ("DBRX experts of another width", _with("dbrx-instruct", "ffn_config", hidden_size=4096),
     "field 'ffn_config.hidden_size' is 4096; expected d_model (6144)"),
    ("DBRX without its FFN section", _with("dbrx-instruct", ffn_config=None),
     "field 'ffn_config' is None; expected an object with ffn_hidden_size, moe_num_experts and moe_top_k"),
    ("DBRX top-level KV heads against attn_config", _with("dbrx-instruct-transformers5", num_key_value_heads=4),
     "field 'num_key_value_heads' is 4; expected attn_config.kv_n_heads (8)"),
    ("DBRX heads that do not split d_model", _with("dbrx-instruct", n_heads=47),
     "field 'n_heads' is 47; expected a divisor of d_model (6144)"),
    ("Mistral-3 wrapper's layer count against its section's", _with(MISTRAL5, num_hidden_layers=39),
     "field 'text_config.num_hidden_layers' is 40; expected the value the top level of config.json gives "
     "'num_hidden_layers' (39)"),
    ("Mistral-3 wrapper's vocab against its section's", _with(MISTRAL5, vocab_size=131_073),
     "field 'text_config.vocab_size' is 131072; expected the value the top level of config.json gives 'vocab_size' "
     "(131073)"),
    ("Step-3.7 digest re-saved: a default language model beside the flat one",
     json.loads((REFUSED_FORMS / "Step-3.7-Flash-transformers5.json").read_text()),
     "field 'text_config.vocab_size' is 128815; expected the value the top level of config.json gives 'vocab_size' "
     "(128896)"),
]


@pytest.mark.parametrize(("hf", "message"), [c[1:] for c in CONTRADICTIONS], ids=[c[0] for c in CONTRADICTIONS])
def test_a_file_that_states_the_model_two_ways_states_one_model(hf: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigFieldError) as info:
        model_config_from_hf(hf, name="m")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_through_the_cli_a_contradiction_exits_2_in_one_line(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_with("dbrx-instruct", "attn_config", kv_n_heads=7)))
    assert main(["plan", "--gpu", "H200", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "field 'attn_config.kv_n_heads' is 7" in err and err.count("\n") == 1 and "Traceback" not in err


def test_through_the_cli_the_resaved_step_digest_exits_2_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "H200", "--model", str(REFUSED_FORMS / "Step-3.7-Flash-transformers5.json")]) == 2
    err = capsys.readouterr().err
    assert "field 'text_config.vocab_size' is 128815" in err and err.count("\n") == 1 and "Traceback" not in err


# ---- a wrapper's two levels: the section sizes the language model, the head's module says whether it is tied ------

@pytest.mark.parametrize(("name", "top", "section", "tied", "head"), [
    (MISTRAL5, True, False, False, "language_model.lm_head"),  # as saved: SGLang's llava.py reads the section's flag
    (MISTRAL5, False, True, True, "language_model.lm_head"),
    (QWEN35_5, False, True, False, "lm_head"),  # SGLang's qwen3_vl.py copies the wrapper's flag over the section's
    (QWEN35_5, True, False, True, "lm_head"),
])
def test_the_tie_flag_is_the_one_of_the_module_that_holds_the_lm_head(
        name: str, top: bool, section: bool, tied: bool, head: str) -> None:
    hf = _with(name, tie_word_embeddings=top)
    hf["text_config"]["tie_word_embeddings"] = section
    weights = model_config_from_hf(hf, name="m").weights
    assert (weights.tied, weights.lm_head_name) == (tied, head)


def test_mistral_small_keeps_its_own_lm_head_of_vocab_by_hidden() -> None:
    """The wrapper's true (Mistral3Config's default) does not tie it: 131,072 x 5,120 more than a tied head."""
    tied = model_config_from_hf(_with(MISTRAL5, "text_config", tie_word_embeddings=True), name="m")
    assert count_parameters(read(MISTRAL5)) - count_parameters(tied) == 131_072 * 5_120


def test_qwen2_vl_nested_by_transformers5_is_the_same_parameters_under_other_names() -> None:
    older, newer = read("Qwen2-VL-7B-Instruct"), read("Qwen2-VL-7B-Instruct-transformers5")
    shapes = [sorted(p.shape for p in m.weights.parameter_specs(tp_size=2)) for m in (older, newer)]
    assert shapes[0] == shapes[1] and count_parameters(older) == count_parameters(newer)
    assert newer.weights.lm_head_name == "lm_head" and newer.weights.embed_name == "language_model.model.embed_tokens"


def test_llama4_resaved_gains_a_vision_config_that_sglang_builds_no_tower_for(
        capsys: pytest.CaptureFixture[str]) -> None:
    """transformers 5 writes Llama4VisionConfig's defaults where the corpus file has none; without
    --enable-multimodal SGLang 0.5.23 builds no tower, so the plan is the same bytes, labelled not_loaded."""
    argv = ["--tp-size", "8"]
    before = plan(CORPUS / "Llama-4-Scout-17B-16E-Instruct.json", argv, capsys)
    after = plan(CORPUS / "Llama-4-Scout-17B-16E-Instruct-transformers5.json", argv, capsys)
    assert before["vision_weights"] == "none" and after == before | {"vision_weights": "not_loaded"}


def test_kimi_k25_resaved_counts_the_vision_tower_transformers5_describes() -> None:
    """The corpus file's vision_config has no shapes; transformers 5 writes KimiK25VisionConfig's (hidden 1152,
    27 layers, MLP 4304, patch 14), so the tower is counted. Less the tower, the same model."""
    older, newer = read("Kimi-K2.5"), read("Kimi-K2.5-transformers5")
    assert (older.vision_weights, newer.vision_weights) == ("not_counted", "counted")
    assert without_vision_tower(newer) == msgspec.structs.replace(without_vision_tower(older), name=newer.name,
                                                                  hf_config=newer.hf_config)
    hidden, mlp, layers, patch, text_hidden = 1152, 4304, 27, 14, 7168
    layer = (4 * hidden * hidden + 4 * hidden) + (2 * hidden * mlp + mlp + hidden) + 2 * 2 * hidden  # attn, MLP, norms
    tower = (hidden * 3 * patch * patch + hidden) + layers * layer + 2 * hidden + (text_hidden * hidden + text_hidden)
    assert count_parameters(newer) - count_parameters(older) == tower == 420_412_144


# ---- DBRX by hand: d_model 6144, 48 heads of 128, 8 KV heads, 40 layers, 16 GLU experts of 10,752, vocab 100,352

def test_dbrx_reads_its_nested_sections() -> None:
    m = read("dbrx-instruct")
    assert (m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (6144, 48, 8, 128)
    assert (m.num_hidden_layers, m.max_position_embeddings, m.rope_theta) == (40, 32768, 500_000.0)
    assert m.layer_kinds == ("full_attention",) * 40


@pytest.mark.parametrize(("tp", "expected"), [
    (1, 40 * 8 * (128 + 128) * 2),  # 163,840 B per token in bf16
    (4, 40 * 2 * 256 * 2),  # 40,960: two KV heads a rank
    (8, 40 * 1 * 256 * 2),  # 20,480
    (16, 40 * 1 * 256 * 2),  # KV heads replicate past 8 ranks, as SGLang's max(1, 8 // tp)
])
def test_dbrx_bytes_per_token_by_hand(tp: int, expected: int) -> None:
    assert sum(p.spec.bytes_per_token for p in specs(read("dbrx-instruct"), tp)) == expected


def test_dbrx_parameters_by_hand_and_the_published_132b() -> None:
    attention = 6144 * (6144 + 2 * 8 * 128) + 6144 * 6144  # Wqkv + out_proj: 88,080,384
    experts = 16 * 3 * 10752 * 6144 + 16 * 6144  # w1, v1, w2 of every expert + the router: 3,170,992,128
    layer = attention + experts + 2 * 6144  # two bias-free LayerNorms
    total = 40 * layer + 2 * 100352 * 6144 + 6144  # untied embedding and lm_head, final norm
    assert count_parameters(read("dbrx-instruct")) == total == 131_596_523_520
    assert total == pytest.approx(132e9, rel=0.01)  # the model card's 132B total parameters
