"""Properties over the hostile-input classes (test_hostile_inputs.py has one pinned case of each): a malformed
file, a config that contradicts itself, a setting past the edge of its type. Drawn by Hypothesis, derandomized
(the same examples on every run), few enough that the three stay within about two seconds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from kvcache.errors import ModelConfigFieldError
from kvcache.inputs.input_files import MAX_NESTING
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.server_arg_types import MAX_COUNT
from kvcache.models.presets import PRESET_DIR
from kvcache.models.hf_config import model_config_from_hf

CORPUS = Path(__file__).resolve().parent / "model_corpus"
QUICK = settings(max_examples=30, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
THROUGH_THE_CLI = settings(QUICK, max_examples=8)  # each example runs the whole command (~0.1 s)


def source(name: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{name}.json"
    return json.loads((path if path.exists() else CORPUS / f"{name}.json").read_text())


# ---- malformed files ---------------------------------------------------------------------------------------------

TEXT = json.dumps(source("SmolLM2-135M"))
SPOILERS: dict[str, Callable[[st.DrawFn], bytes]] = {
    "byte-order mark": lambda draw: draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"])) + TEXT.encode(),
    "UTF-16/32": lambda draw: TEXT.encode(draw(st.sampled_from(["utf-16-le", "utf-16-be", "utf-32-le"]))),
    "a byte that is not UTF-8": lambda draw: (lambda at: TEXT[:at].encode() + draw(st.sampled_from(
        [b"\x80", b"\xc3", b"\xff", b"\xe9"])) + TEXT[at:].encode())(draw(st.integers(1, len(TEXT) - 1))),
    "cut short": lambda draw: TEXT[:draw(st.integers(0, len(TEXT) - 1))].encode(),
    "not an object": lambda draw: json.dumps(draw(st.one_of(st.lists(st.integers(), max_size=3), st.text(max_size=5),
                                                            st.integers(), st.none()))).encode(),
    "nested too deep": lambda draw: (lambda d: b'{"x": ' + b"[" * d + b"]" * d + b"}")(
        draw(st.integers(MAX_NESTING, 5_000))),
    "a key twice": lambda draw: TEXT[:-1].encode() + b', "hidden_size": ' + str(draw(
        st.integers(1, 10**6).filter(lambda h: h != 576))).encode() + b"}",  # SmolLM2's is 576: the same twice is fine
}


@st.composite
def spoiled_files(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(sorted(SPOILERS)))
    return kind, SPOILERS[kind](draw)


@THROUGH_THE_CLI
@given(spoiled=spoiled_files(), flag=st.sampled_from(["--model", "--config"]))
def test_a_spoiled_file_exits_2_naming_it(spoiled: tuple[str, bytes], flag: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(spoiled[1])
    code = main(["plan", "--gpu", "H200", flag, str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(path) in err, (spoiled[0], err)


# ---- configs that contradict themselves ---------------------------------------------------------------------------

def _non_divisor(draw: st.DrawFn, n: int, high: int) -> int:
    return draw(st.integers(2, high).filter(lambda d: n % d != 0))


def _top_k_past_experts(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    name, key = draw(st.sampled_from([("gpt-oss-20b", "num_local_experts"), ("Qwen3-30B-A3B", "num_experts"),
                                      ("DeepSeek-V3", "n_routed_experts"), ("Mixtral-8x22B-v0.1", "num_local_experts")]))
    hf = source(name)
    hf["num_experts_per_tok"] = hf[key] + draw(st.integers(1, 1000))
    return hf, "num_experts_per_tok"


def _groups_not_splitting(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    hf = source("DeepSeek-V3")
    hf["n_group"] = _non_divisor(draw, hf["n_routed_experts"], hf["n_routed_experts"])
    return hf, "n_group"


def _dense_past_the_end(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    hf = source(draw(st.sampled_from(["DeepSeek-V3", "DeepSeek-V2-Lite", "Kimi-K2-Instruct"])))
    hf["first_k_dense_replace"] = hf["num_hidden_layers"] + draw(st.integers(0, 100))
    return hf, "first_k_dense_replace"


def _mamba_groups(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    name, heads, key = draw(st.sampled_from([("Nemotron-H-56B-Base-8K", "mamba_num_heads", "n_groups"),
                                             ("Bamba-9B", "mamba_n_heads", "mamba_n_groups"),
                                             ("Falcon-H1-0.5B-Base", "mamba_n_heads", "mamba_n_groups")]))
    hf = source(name)
    hf[key] = _non_divisor(draw, hf[heads], hf[heads] - 1)
    return hf, key


def _delta_net_heads(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    hf = source("Qwen3-Next-80B-A3B-Thinking")
    key_heads = hf["linear_num_key_heads"]
    hf["linear_num_value_heads"] = key_heads * draw(st.integers(0, 4)) + draw(st.integers(1, key_heads - 1))
    return hf, "linear_num_value_heads"


def _jamba_offset(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    hf = source("Jamba-v0.1")
    period, offset = draw(st.sampled_from([("attn_layer_period", "attn_layer_offset"),
                                           ("expert_layer_period", "expert_layer_offset")]))
    hf[offset] = hf[period] + draw(st.integers(0, 50))
    return hf, offset


def _wrapper_disagrees(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    hf = source(draw(st.sampled_from(["Llama-4-Scout-17B-16E-Instruct", "gemma-3-27b-it", "Qwen3-VL-8B-Instruct"])))
    key = draw(st.sampled_from(["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]))
    hf[key] = hf["text_config"][key] + draw(st.integers(1, 64))
    return hf, f"text_config.{key}"


CONTRADICTIONS = [_top_k_past_experts, _groups_not_splitting, _dense_past_the_end, _mamba_groups, _delta_net_heads,
                  _jamba_offset, _wrapper_disagrees]


@QUICK
@given(data=st.data())
def test_a_contradiction_is_refused_naming_its_field(data: st.DataObject) -> None:
    hf, field = data.draw(st.sampled_from(CONTRADICTIONS)).__call__(data.draw)
    with pytest.raises(ModelConfigFieldError) as info:
        model_config_from_hf(hf, name="m")
    assert f"field '{field}' is " in str(info.value) and "\n" not in str(info.value)


# ---- settings at and past the edges of their types ----------------------------------------------------------------

INT_FIELDS = sorted(n for n, t in ServerArgs.__annotations__.items() if "Int" in str(t))
FLOAT_FIELDS = sorted(n for n in ServerArgs.__struct_fields__ if isinstance(getattr(ServerArgs(), n), float))
INT_EDGES = [0, -1, 1, MAX_COUNT, MAX_COUNT + 1, 2**63, 10**30]
FLOAT_EDGES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 1e-308, 1e308, 5e-324]


@st.composite
def edge_settings(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(INT_FIELDS + FLOAT_FIELDS), min_size=1, max_size=3, unique=True))
    return {n: draw(st.sampled_from(INT_EDGES if n in INT_FIELDS else FLOAT_EDGES)) for n in names}


def past_the_type(name: str, value: Any) -> bool:
    """Values no field of that type takes: non-finite floats, counts past an int32 index or below zero."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return value > MAX_COUNT or value < 0


@THROUGH_THE_CLI
@given(values=edge_settings())
def test_a_setting_at_or_past_its_edge_exits_0_2_or_3_in_one_line(values: dict[str, Any], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(values))  # json.dumps writes NaN and Infinity, which the reader takes
    code = main(["plan", "--gpu", "H100-80GB", "--model", "Qwen3-Next-80B-A3B-Thinking", "--config", str(path)])
    err = capsys.readouterr().err
    assert code in (0, 2, 3) and err.count("\n") <= 1, (values, err)
    if any(past_the_type(n, v) for n, v in values.items()):
        assert code == 2, (values, err)
