"""ModelConfig from real HF config.json presets: layer kinds, head_dim, dtype, context length, errors."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvcache.models.registry import FAMILIES
from kvcache.errors import ConfigError, UnsupportedModelError
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import PRESET_DIR, load_model_config, preset_names
from kvcache.models.hf_config import model_config_from_hf

# name: (layers, {kind: count}, head_dim, kv heads, max_position_embeddings, checkpoint dtype, window)
# all taken from the published config.json files in kvcache/models/presets/
EXPECTED: dict[str, tuple[int, dict[str, int], int, int, int, str | None, int | None]] = {
    "SmolLM2-135M": (30, {"full_attention": 30}, 576 // 9, 3, 8192, "bfloat16", None),
    "Llama-3.2-1B-Instruct": (16, {"full_attention": 16}, 64, 8, 131072, "bfloat16", None),
    "Llama-3.1-8B-Instruct": (32, {"full_attention": 32}, 4096 // 32, 8, 131072, "bfloat16", None),
    "Llama-2-7b-hf": (32, {"full_attention": 32}, 4096 // 32, 32, 4096, "float16", None),
    # sliding_window 131072 is set, but use_sliding_window is false: every layer is full
    "Qwen2.5-7B-Instruct": (28, {"full_attention": 28}, 3584 // 28, 4, 32768, "bfloat16", None),
    "Qwen3-8B": (36, {"full_attention": 36}, 128, 8, 40960, "bfloat16", None),
    # sliding_window 4096 and no use_sliding_window key: Mistral slides on every layer
    "Mistral-7B-v0.1": (32, {"sliding_attention": 32}, 4096 // 32, 8, 32768, "bfloat16", 4096),
    # MLA: head_dim is qk_nope_head_dim + qk_rope_head_dim = 128 + 64
    "DeepSeek-V3": (61, {"mla": 61}, 128 + 64, 128, 163840, "bfloat16", None),
    "DeepSeek-V2-Lite": (27, {"mla": 27}, 128 + 64, 16, 163840, "bfloat16", None),
    # explicit head_dim 64 although hidden / heads = 2880 / 64 = 45; no torch_dtype in the config
    "gpt-oss-20b": (24, {"full_attention": 12, "sliding_attention": 12}, 64, 8, 131072, None, 128),
    # explicit head_dim 256 although hidden / heads = 3584 / 16 = 224
    "gemma-2-9b-it": (42, {"full_attention": 21, "sliding_attention": 21}, 256, 8, 8192, "bfloat16", 4096),
    # explicit head_dim 256 although hidden / heads = 2048 / 16 = 128
    "Qwen3-Next-80B-A3B-Thinking": (48, {"full_attention": 12, "linear_attention": 36}, 256, 2, 262144, "bfloat16", None),
    # attention_head_dim 128 (= 8192 / 64)
    "Nemotron-H-56B-Base-8K": (118, {"mamba2": 54, "full_attention": 10, "mlp": 54}, 128, 8, 8192, "bfloat16", None),
    "EAGLE3-LLaMA3.1-Instruct-8B": (1, {"full_attention": 1}, 4096 // 32, 8, 2048, "float16", None),
    # no attention: no heads, and no length in the config (both engines take 2048)
    "Mamba-Codestral-7B-v0.1": (64, {"mamba2": 64}, 0, 0, 2048, "bfloat16", None),
}


def raw_preset(name: str) -> dict[str, Any]:
    return json.loads((PRESET_DIR / f"{name}.json").read_text())


def test_every_shipped_preset_is_covered() -> None:
    assert sorted(EXPECTED) == preset_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_shape(name: str) -> None:
    layers, kinds, head_dim, kv_heads, max_pos, ckpt, window = EXPECTED[name]
    m = load_model_config(name)
    assert m.name == name
    assert m.num_hidden_layers == layers == len(m.layer_kinds)
    assert dict(Counter(m.layer_kinds)) == kinds
    assert m.head_dim == head_dim
    assert m.num_key_value_heads == kv_heads
    assert m.max_position_embeddings == max_pos
    assert m.checkpoint_dtype == ckpt
    assert m.sliding_window == window
    assert m.hf_config == raw_preset(name)  # the raw dict is kept unchanged
    assert m.kv_layer_count == sum(n for k, n in kinds.items() if k in ("full_attention", "sliding_attention", "mla"))


@pytest.mark.parametrize(
    ("name", "hybrid"),
    [("Llama-3.1-8B-Instruct", False), ("Mistral-7B-v0.1", False), ("DeepSeek-V3", False),
     ("gpt-oss-20b", True), ("gemma-2-9b-it", True), ("Qwen3-Next-80B-A3B-Thinking", True),
     ("Nemotron-H-56B-Base-8K", True)],
)
def test_is_hybrid(name: str, hybrid: bool) -> None:
    assert load_model_config(name).is_hybrid is hybrid


def test_gpt_oss_follows_its_layer_types() -> None:
    m = load_model_config("gpt-oss-20b")
    assert list(m.layer_kinds) == raw_preset("gpt-oss-20b")["layer_types"]
    assert m.layer_kinds[0] == "sliding_attention" and m.layer_kinds[1] == "full_attention"


def test_gemma2_slides_on_even_layers() -> None:
    kinds = load_model_config("gemma-2-9b-it").layer_kinds
    assert all(kinds[i] == ("sliding_attention" if i % 2 == 0 else "full_attention") for i in range(42))


def test_qwen3_next_has_full_attention_every_fourth_layer() -> None:
    kinds = load_model_config("Qwen3-Next-80B-A3B-Thinking").layer_kinds
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    assert full == list(range(3, 48, 4))  # 3, 7, ..., 47: full_attention_interval 4
    assert all(k == "linear_attention" for i, k in enumerate(kinds) if i not in full)


def test_nemotron_h_follows_its_hybrid_override_pattern() -> None:
    pattern = raw_preset("Nemotron-H-56B-Base-8K")["hybrid_override_pattern"]
    m = load_model_config("Nemotron-H-56B-Base-8K")
    counts = Counter(pattern)
    assert dict(Counter(m.layer_kinds)) == {"mamba2": counts["M"], "full_attention": counts["*"], "mlp": counts["-"]}
    assert [i for i, c in enumerate(pattern) if c == "*"] == [i for i, k in enumerate(m.layer_kinds) if k == "full_attention"]
    assert (m.mamba_num_heads, m.mamba_head_dim, m.ssm_state_size, m.mamba_n_groups, m.mamba_conv_kernel) == (256, 64, 256, 8, 4)


def test_mla_fields() -> None:
    m = load_model_config("DeepSeek-V3")
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim, m.nextn_layer_kinds) == (512, 64, 128, ("mla",))


def test_qwen3_next_linear_attention_fields() -> None:
    m = load_model_config("Qwen3-Next-80B-A3B-Thinking")
    assert (m.linear_num_key_heads, m.linear_num_value_heads, m.linear_key_head_dim,
            m.linear_value_head_dim, m.linear_conv_kernel_dim) == (16, 32, 128, 128, 4)


def test_eagle_head_is_a_draft_head() -> None:
    m = load_model_config("EAGLE3-LLaMA3.1-Instruct-8B")
    assert m.is_draft_head and not m.nextn_of_target


# ---- readers on edited configs ---------------------------------------------------------

@pytest.mark.parametrize(
    ("overrides", "head_dim"),
    [
        ({}, 4096 // 32),
        ({"head_dim": 96}, 96),  # explicit head_dim wins over hidden / heads
        ({"attention_head_dim": 80}, 80),
        ({"head_dim": None}, 128),  # null falls back to hidden / heads
        ({"hidden_size": 5120, "num_attention_heads": 40}, 5120 // 40),
    ],
)
def test_head_dim_rules(overrides: dict[str, Any], head_dim: int) -> None:
    m = model_config_from_hf({**raw_preset("Llama-3.1-8B-Instruct"), **overrides})
    assert m.head_dim == m.v_head_dim == head_dim


def test_missing_num_key_value_heads_means_mha() -> None:
    hf = raw_preset("Llama-3.1-8B-Instruct")
    del hf["num_key_value_heads"]
    assert model_config_from_hf(hf).num_key_value_heads == 32


@pytest.mark.parametrize(
    ("max_window_layers", "full", "sliding"),
    [(20, 20, 8), (0, 0, 28), (28, 28, 0)],
)
def test_qwen2_slides_from_max_window_layers_when_turned_on(max_window_layers: int, full: int, sliding: int) -> None:
    hf = {**raw_preset("Qwen2.5-7B-Instruct"), "use_sliding_window": True, "max_window_layers": max_window_layers,
          "sliding_window": 4096}
    kinds = model_config_from_hf(hf).layer_kinds
    assert Counter(kinds)["full_attention"] == full and Counter(kinds)["sliding_attention"] == sliding
    assert all(k == "full_attention" for k in kinds[:max_window_layers])


def test_gemma3_style_pattern() -> None:
    hf = {**raw_preset("gemma-2-9b-it"), "architectures": ["Gemma3ForCausalLM"], "sliding_window_pattern": 6,
          "num_hidden_layers": 12}
    kinds = model_config_from_hf(hf).layer_kinds
    assert [i for i, k in enumerate(kinds) if k == "full_attention"] == [5, 11]  # every 6th layer is global


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("Llama-3.1-8B-Instruct", "num_hidden_layers"),
        ("Llama-3.1-8B-Instruct", "hidden_size"),
        ("Llama-3.1-8B-Instruct", "num_attention_heads"),
        ("Llama-3.1-8B-Instruct", "vocab_size"),
        ("Llama-3.1-8B-Instruct", "max_position_embeddings"),
        ("gemma-2-9b-it", "sliding_window"),
        ("DeepSeek-V3", "kv_lora_rank"),
        ("DeepSeek-V3", "qk_rope_head_dim"),
        ("Qwen3-Next-80B-A3B-Thinking", "full_attention_interval"),
        ("Qwen3-Next-80B-A3B-Thinking", "linear_num_value_heads"),
        ("Nemotron-H-56B-Base-8K", "hybrid_override_pattern"),
        ("Nemotron-H-56B-Base-8K", "ssm_state_size"),
        ("gpt-oss-20b", "sliding_window"),
    ],
)
def test_a_missing_field_is_named(name: str, field: str) -> None:
    hf = raw_preset(name)
    del hf[field]
    with pytest.raises(UnsupportedModelError, match=f"{re.escape(name)}: config.json has no '{field}'"):
        model_config_from_hf(hf, name=name)


def test_an_unknown_decoder_architecture_goes_to_the_generic_reader() -> None:
    hf = {**raw_preset("Llama-3.1-8B-Instruct"), "architectures": ["SomeNewForCausalLM"]}
    assert model_config_from_hf(hf).layer_kinds == load_model_config("Llama-3.1-8B-Instruct").layer_kinds


@pytest.mark.parametrize(
    ("arch", "message"),
    [
        ("BertModel", "architecture 'BertModel' is not a decoder-only language model; supported: any "),
        ("RwkvForCausalLM", "architecture 'RwkvForCausalLM' is an RWKV model .*; not supported"),
    ],
)
def test_an_unsupported_architecture_is_named(arch: str, message: str) -> None:
    hf = {**raw_preset("Llama-3.1-8B-Instruct"), "architectures": [arch]}
    with pytest.raises(UnsupportedModelError, match=message) as info:
        model_config_from_hf(hf)
    if arch == "BertModel":
        for family in FAMILIES:
            assert family in str(info.value)


def test_a_config_without_architectures_is_refused() -> None:
    hf = raw_preset("Llama-3.1-8B-Instruct")
    del hf["architectures"]
    with pytest.raises(UnsupportedModelError, match="has no 'architectures' list"):
        model_config_from_hf(hf, name="x")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"hybrid_override_pattern": "M*-"}, "field 'hybrid_override_pattern' is '3 layers'; expected one letter per "
                                             "layer \\(num_hidden_layers is 118\\)"),
        ({"hybrid_override_pattern": "X" * 118}, r"field 'hybrid_override_pattern' is 'XXX.*\.\.\.; expected only the letters "
                                                 r"M, \*, -, E \(found \['X'\]\)"),
    ],
)
def test_nemotron_pattern_errors(edit: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        model_config_from_hf({**raw_preset("Nemotron-H-56B-Base-8K"), **edit})


def test_an_unknown_layer_type_is_named() -> None:
    hf = raw_preset("gpt-oss-20b")
    hf["layer_types"] = ["full_attention"] * 23 + ["mamba"]
    with pytest.raises(UnsupportedModelError, match=r"field 'layer_types\[23\]' is 'mamba'; expected one of .*"
                                                    r"sliding_attention \(this layer type is not supported\)"):
        model_config_from_hf(hf)


def test_layer_kinds_must_match_the_layer_count() -> None:
    m = load_model_config("Llama-3.2-1B-Instruct")
    with pytest.raises(ConfigError, match="15 layer kinds for 16 layers"):
        ModelConfig(**{**{f: getattr(m, f) for f in m.__struct_fields__}, "layer_kinds": m.layer_kinds[:15]})


# ---- context length ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("requested", "allow", "expected"),
    [
        (None, False, 131072),
        (4096, False, 4096),  # lowering is always fine
        (131072, False, 131072),
        (262144, True, 262144),  # raising needs --allow-long-context
    ],
)
def test_context_length(requested: int | None, allow: bool, expected: int) -> None:
    m = load_model_config("Llama-3.1-8B-Instruct")
    assert m.context_length(requested, allow_long_context=allow) == expected


def test_a_longer_context_is_refused_and_names_the_max() -> None:
    m = load_model_config("Llama-2-7b-hf")
    with pytest.raises(ConfigError, match="--context-length 4097 is longer than Llama-2-7b-hf's max_position_embeddings "
                                          "4096; use at most 4096, or pass --allow-long-context"):
        m.context_length(4097)


# ---- loading ----------------------------------------------------------------------------

def test_load_from_a_directory_and_a_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((PRESET_DIR / "Llama-3.2-1B-Instruct.json").read_text())
    by_dir = load_model_config(str(model_dir))
    by_file = load_model_config(str(model_dir / "config.json"))
    assert by_dir.name == by_file.name == "my-llama"
    assert by_dir.layer_kinds == by_file.layer_kinds == load_model_config("Llama-3.2-1B-Instruct").layer_kinds


def test_an_unknown_model_lists_the_presets(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown model .*no such file or directory. Presets: DeepSeek-V2-Lite, "):
        load_model_config(str(tmp_path / "nothing-here"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"model config .*config\.json is not valid JSON"),
        ("[1, 2, 3]", r"must hold a JSON object \(a TOML table\), not list"),
        ("\xff\xfe", r"config\.json starts with a UTF-16 byte-order mark; save it as UTF-8 without one"),
    ],
)
def test_malformed_config_json(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(ConfigError, match=message):
        model_config_from_hf(path)


def test_a_directory_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no model config at .*config\.json"):
        model_config_from_hf(tmp_path)


def test_from_a_mapping_takes_its_name_from_the_config() -> None:
    hf = raw_preset("Llama-3.2-1B-Instruct")
    assert model_config_from_hf(hf).name == "LlamaForCausalLM"  # no _name_or_path: the architecture
    assert model_config_from_hf({**hf, "_name_or_path": "meta/llama"}).name == "meta/llama"
    assert model_config_from_hf(hf, name="given").name == "given"


# ---- NEXTN draft ------------------------------------------------------------------------

def test_nextn_draft_is_the_targets_mtp_layer() -> None:
    target = load_model_config("DeepSeek-V3")
    draft = target.nextn_draft()
    assert draft.name == "DeepSeek-V3 (NEXTN)"
    assert (draft.num_hidden_layers, draft.layer_kinds) == (1, ("mla",))
    assert draft.is_draft_head and draft.nextn_of_target and draft.nextn_layer_kinds == ()
    assert (draft.kv_lora_rank, draft.qk_rope_head_dim) == (512, 64)
    assert target.num_hidden_layers == 61  # the target is unchanged


@pytest.mark.parametrize("name", ["Llama-3.1-8B-Instruct", "DeepSeek-V2-Lite"])
def test_nextn_draft_needs_mtp_layers(name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} has no next-token-prediction layers .*use EAGLE"):
        load_model_config(name).nextn_draft()
