"""Hostile and self-contradicting input at start-up: every case exits 2 in one line naming the file or field,
the value and what was expected; none hangs, reads unbounded input, or plans on a contradiction.

Files (`--model` config.json and `--config` settings) that are not a well-formed UTF-8 object of sane size and
depth; model fields that contradict each other (one case per family reader); ServerArgs values past their type."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from kvcache.errors import ConfigError, ModelConfigFieldError
from kvcache.inputs.input_files import MAX_INPUT_FILE_BYTES, MAX_NESTING
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.server_arg_types import MAX_COUNT
from kvcache.models.presets import PRESET_DIR
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).resolve().parent / "model_corpus"
LLAMA_TEXT = (PRESET_DIR / "Llama-3.1-8B-Instruct.json").read_text()
LLAMA = json.loads(LLAMA_TEXT)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a command that must exit 2."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


# ---- files: bytes that are not a well-formed object -------------------------------------------------------------

BAD_FILES: list[tuple[str, bytes, str]] = [
    ("bom", b"\xef\xbb\xbf" + LLAMA_TEXT.encode(), "starts with a UTF-8 byte-order mark; save it as UTF-8 without one"),
    ("utf16", LLAMA_TEXT.encode("utf-16"), "starts with a UTF-16 byte-order mark"),
    ("utf16 without a mark", LLAMA_TEXT.encode("utf-16-le"), "holds a NUL byte at offset 1: it is binary or UTF-16/32"),
    ("latin-1", b'{"model_type": "ll\xe9ma"}', "is not UTF-8 text (byte 0xe9 at offset 18)"),
    ("top-level list", b"[1, 2]", "must hold a JSON object (a TOML table), not list"),
    ("top-level null", b"null", "must hold a JSON object (a TOML table), not NoneType"),
    ("empty", b"", "is not valid JSON: Expecting value: line 1 column 1"),
    ("two objects", b"{}{}", "is not valid JSON: Extra data"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, f"nests lists or objects too deep; expected at most {MAX_NESTING}"),
    ("nesting past the bound", b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", f"nests lists or objects more than {MAX_NESTING} levels deep"),
    ("a 5,000-digit number", b'{"hidden_size": ' + b"9" * 5000 + b"}", "holds a number of 5,000 digits; expected at most 4000"),
    ("a key twice", b'{"hidden_size": 4096, "hidden_size": 8192}', "twice with different values (4096, 8192): keep one"),
]


@pytest.mark.parametrize(("content", "message"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
@pytest.mark.parametrize("flag", ["--model", "--config"])
def test_a_malformed_file_is_one_line_naming_it(flag: str, content: bytes, message: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / ("config.json" if flag == "--model" else "settings.json")
    path.write_bytes(content)
    err = refused(["plan", "--gpu", "H200", flag, str(path)], capsys)
    assert f"{'model config' if flag == '--model' else 'config file'} {path} " in err and message in err


def test_a_toml_settings_file_nested_too_deep_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text("a = " + "[" * 500 + "]" * 500)  # tomllib recursed out at this depth: an internal error
    assert f"config file {path} nests arrays or tables too deep" in refused(["plan", "--gpu", "H200", "--config", str(path)], capsys)


def test_a_file_past_the_size_bound_is_refused_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    with path.open("wb") as f:
        f.truncate(MAX_INPUT_FILE_BYTES + 1)  # sparse: nothing is written, and nothing may be read
    err = refused(["plan", "--gpu", "H200", "--model", str(path)], capsys)
    assert f"is {MAX_INPUT_FILE_BYTES + 1:,} bytes; expected at most {MAX_INPUT_FILE_BYTES:,}" in err


@pytest.mark.parametrize("flag", ["--model", "--config"])
@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device"),
                                            ("fifo", "a FIFO (named pipe)"), ("dir", "a directory")])
def test_a_path_that_is_not_a_regular_file_is_refused_without_reading(flag: str, path: str, kind: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/zero never ends and a FIFO with no writer blocks on open: both hung or filled memory before."""
    if path == "fifo":
        path = str(tmp_path / "pipe.json")
        os.mkfifo(path)
    elif path == "dir":
        path = str(tmp_path / "d.json")
        os.mkdir(path)
    elif not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    named = path
    if flag == "--model" and kind == "a directory":  # a model directory is read for its config.json
        os.mkdir(Path(path) / "config.json")
        named = str(Path(path) / "config.json")
    assert f"{named} is {kind}, not a regular file: pass the file itself" in refused(
        ["plan", "--gpu", "H200", flag, path], capsys)


def test_non_finite_numbers_in_config_json_name_their_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(LLAMA_TEXT.replace('"num_hidden_layers": 32', '"num_hidden_layers": NaN'))
    assert "field 'num_hidden_layers' is nan; expected a positive integer" in refused(
        ["plan", "--gpu", "H200", "--model", str(tmp_path)], capsys)


# ---- model fields that contradict each other, per family reader ---------------------------------------------------

def corpus(name: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{name}.json"
    return json.loads((path if path.exists() else CORPUS / f"{name}.json").read_text())


def edited(name: str, section: str | None = None, **edit: Any) -> dict[str, Any]:
    hf = corpus(name)
    target = hf[section] if section else hf
    target.update(edit)
    return hf


CONTRADICTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("gpt-oss top-k above its experts", edited("gpt-oss-20b", num_experts_per_tok=64),
     "field 'num_experts_per_tok' is 64; expected a positive integer (at most 32)"),
    ("Qwen3 MoE top-k of 0", edited("Qwen3-30B-A3B", num_experts_per_tok=0),
     "field 'num_experts_per_tok' is 0; expected a positive integer (at most 128)"),
    ("DeepSeek groups that do not split the experts", edited("DeepSeek-V3", n_group=7),
     "field 'n_group' is 7; expected a divisor of the 256 routed experts"),
    ("DeepSeek top-k beyond its chosen groups", edited("DeepSeek-V3", topk_group=1, num_experts_per_tok=40),
     "field 'topk_group' is 1; expected enough groups of 32 experts for num_experts_per_tok 40 (at least 2)"),
    ("DeepSeek dense past its last layer", edited("DeepSeek-V3", first_k_dense_replace=61),
     "field 'first_k_dense_replace' is 61; expected an integer from 0 to 60"),
    ("DeepSeek latent wider than hidden", edited("DeepSeek-V3", kv_lora_rank=8192),
     "field 'kv_lora_rank' is 8192; expected a positive integer (at most 7,168)"),
    ("Qwen3 MoE dense-only layer past the end", edited("Qwen3-30B-A3B", mlp_only_layers=[48]),
     "field 'mlp_only_layers[0]' is 48; expected an integer from 0 to 47"),
    ("Qwen3 MoE with every layer dense", edited("Qwen3-30B-A3B", mlp_only_layers=list(range(48))),
     "leave at least one of the 48 layers routing to the experts"),
    ("Llama-4 interleave past its layers", edited("Llama-4-Scout-17B-16E-Instruct", "text_config", interleave_moe_layer_step=49),
     "field 'text_config.interleave_moe_layer_step' is 49; expected a positive integer (at most 48)"),
    ("Jamba attention offset past its period", edited("Jamba-v0.1", attn_layer_offset=8),
     "field 'attn_layer_offset' is 8; expected an integer from 0 to 7"),
    ("Jamba expert offset past its period", edited("Jamba-v0.1", expert_layer_offset=2),
     "field 'expert_layer_offset' is 2; expected an integer from 0 to 1"),
    ("Nemotron-H groups that do not split its heads", edited("Nemotron-H-56B-Base-8K", n_groups=7),
     "field 'n_groups' is 7; expected a divisor of the 256 Mamba heads"),
    ("Nemotron-H pattern against its block list", edited("Nemotron-H-56B-Base-8K", layers_block_type=["mamba"] * 118),
     "field 'hybrid_override_pattern' is 'M-M-M-M*-"),
    ("Falcon-H1 state width against heads x head_dim", edited("Falcon-H1-0.5B-Base", mamba_d_ssm=1000),
     "field 'mamba_d_ssm' is 1000; expected mamba_n_heads x mamba_d_head = 24 x 64 = 1536"),
    ("Bamba groups that do not split its heads", edited("Bamba-9B", mamba_n_groups=7),
     "field 'mamba_n_groups' is 7; expected a divisor of the 128 Mamba heads"),
    ("Qwen3-Next value heads not a multiple of key heads", edited("Qwen3-Next-80B-A3B-Thinking", linear_num_key_heads=64),
     "field 'linear_num_value_heads' is 32; expected a multiple of linear_num_key_heads (64)"),
    ("Gemma-3 a sliding pattern with no full layer", edited("gemma-3-27b-it", "text_config", sliding_window_pattern=63,
                                                            layer_types=None),
     "field 'text_config.sliding_window_pattern' is 63; expected a positive integer (at most 62)"),
    ("Gemma-3 vision image smaller than a patch", edited("gemma-3-27b-it", "vision_config", image_size=7),
     "field 'vision_config.image_size' is 7; expected an integer from 14 to 65,536"),
    ("a wrapper whose top level disagrees with text_config", edited("Llama-4-Scout-17B-16E-Instruct", num_hidden_layers=99),
     "field 'text_config.num_hidden_layers' is 48; expected the value the top level of config.json gives "
     "'num_hidden_layers' (99)"),
    ("two language-model sections", edited("Llama-4-Scout-17B-16E-Instruct", llm_config={"hidden_size": 1}),
     "field 'llm_config' is 'a second language-model section'; expected only one of text_config, llm_config"),
    ("torch_dtype against dtype", edited("Llama-3.1-8B-Instruct", dtype="float16"),
     "field 'dtype' is 'float16'; expected the same as torch_dtype ('bfloat16')"),
    ("rope_scaling that is not an object", edited("Llama-3.1-8B-Instruct", rope_scaling="yarn"),
     "field 'rope_scaling' is 'yarn'; expected a JSON object"),
    ("rope_scaling with a factor of 0", edited("Llama-3.1-8B-Instruct", rope_scaling={"rope_type": "yarn", "factor": 0}),
     "field 'rope_scaling.factor' is 0; expected a positive, finite number"),
    ("rope_scaling with an original context of -1", edited("Llama-3.1-8B-Instruct", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": -1}),
     "field 'rope_scaling.original_max_position_embeddings' is -1; expected a positive integer"),
]


@pytest.mark.parametrize(("hf", "message"), [c[1:] for c in CONTRADICTIONS], ids=[c[0] for c in CONTRADICTIONS])
def test_a_config_that_contradicts_itself_is_refused(hf: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigFieldError) as info:
        model_config_from_hf(hf, name="m")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_through_the_cli_a_contradiction_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The DeepSeek-V3 top-k case planned 4,285,619 tokens a rank before (exit 0)."""
    (tmp_path / "config.json").write_text(json.dumps(edited("DeepSeek-V3", n_group=7)))
    assert "field 'n_group' is 7" in refused(["plan", "--gpu", "H200", "--tp-size", "8", "--model", str(tmp_path)], capsys)


# ---- ServerArgs past the edges of their types -------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ('{"mamba_full_memory_ratio": Infinity}', "--mamba-full-memory-ratio inf is not a finite number; use one such as 0.9"),
    ("mamba-full-memory-ratio = inf", "--mamba-full-memory-ratio inf is not a finite number"),  # was: internal error
    # a settings file's value is named by its flag and field, not by msgspec's `$.` path (issue 22)
    ('{"mem_fraction_static": NaN}',
     "mem-fraction-static = nan is refused (--mem-fraction-static, ServerArgs.mem_fraction_static): expected float > 0.0"),
    (f'{{"page_size": {MAX_COUNT + 1}}}', f"(--page-size, ServerArgs.page_size): expected int <= {MAX_COUNT}"),
    (f'{{"max_running_requests": {10**23}}}',
     f"(--max-running-requests, ServerArgs.max_running_requests): expected int <= {MAX_COUNT}"),
])
def test_a_setting_past_its_type_is_refused(text: str, message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / ("s.json" if text.startswith("{") else "s.toml")
    path.write_text(text)
    assert message in refused(["plan", "--gpu", "H200", "--config", str(path)], capsys)


@pytest.mark.parametrize("flag", ["--page-size", "--max-total-tokens", "--context-length", "--cuda-graph-max-bs",
                                  "--tp-size", "--max-running-requests"])
def test_a_count_past_an_int32_index_is_refused_as_a_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["plan", "--gpu", "H200", flag, str(MAX_COUNT + 1)], capsys)
    assert f"argument {flag}" in err and "expected an integer >= " in err and f"<= {MAX_COUNT}, got '{MAX_COUNT + 1}'" in err


def test_every_float_setting_refuses_infinity() -> None:
    floats = [name for name in ServerArgs.__struct_fields__ if isinstance(getattr(ServerArgs(), name), float)]
    assert {"swa_full_tokens_ratio", "mamba_full_memory_ratio", "min_rank_memory_ratio"} <= set(floats)
    for name in floats:
        with pytest.raises(ConfigError):
            ServerArgs.from_mapping({name: float("inf")})
