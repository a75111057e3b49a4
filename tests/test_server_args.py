"""ServerArgs: decoding with msgspec's paths, cross-field rules, files, replace(), derived values."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvcache.errors import ConfigError
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.settings_file import read_settings_file, server_args_from_file


# ---- field-level decoding: msgspec's message and path ------------------------------------

@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"page_size": 0}, "Expected `int` >= 1 - at `$.page_size`"),
        ({"page_size": "16"}, "Expected `int | null`, got `str` - at `$.page_size`"),
        ({"tp_size": 1.5}, "Expected `int`, got `float` - at `$.tp_size`"),
        ({"max_total_tokens": -5}, "Expected `int` >= 1 - at `$.max_total_tokens`"),
        ({"cuda_graph_max_bs": -1}, "Expected `int` >= 0 - at `$.cuda_graph_max_bs`"),
        ({"mem_fraction_static": 1.0}, "Expected `float` < 1.0 - at `$.mem_fraction_static`"),
        ({"mem_fraction_static": 0.0}, "Expected `float` > 0.0 - at `$.mem_fraction_static`"),
        ({"swa_full_tokens_ratio": 1.5}, "Expected `float` <= 1.0 - at `$.swa_full_tokens_ratio`"),
        ({"mamba_full_memory_ratio": 0}, "Expected `float` > 0.0 - at `$.mamba_full_memory_ratio`"),
        ({"kv_cache_dtype": "fp16"}, "Invalid enum value 'fp16' - at `$.kv_cache_dtype`"),
        ({"dtype": "int8"}, "Invalid enum value 'int8' - at `$.dtype`"),
        ({"device": "tpu"}, "Invalid enum value 'tpu' - at `$.device`"),
        ({"load_format": "safetensors"}, "Invalid enum value 'safetensors' - at `$.load_format`"),
        ({"speculative_algorithm": "MEDUSA"}, "Invalid enum value 'MEDUSA' - at `$.speculative_algorithm`"),
        ({"allow_long_context": "yes"}, "Expected `bool`, got `str` - at `$.allow_long_context`"),
    ],
)
def test_a_bad_value_fails_with_msgspecs_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerArgs.from_mapping(data)


@pytest.mark.parametrize("field", ["bogus", "page-size", "mem_fraction", "max_num_seq"])
def test_unknown_fields_are_refused(field: str) -> None:
    # dashes are only translated for files (flag spelling); a mapping must use field names
    with pytest.raises(ConfigError, match=f"unknown field `{re.escape(field)}`"):
        ServerArgs.from_mapping({field: 1})


def test_defaults_decode_from_an_empty_mapping() -> None:
    args = ServerArgs.from_mapping({})
    assert args == ServerArgs()
    assert (args.page_size, args.tp_size, args.kv_cache_dtype, args.dtype) == (None, 1, "auto", "auto")  # page: the model's
    assert args.mem_fraction_static is None and args.kv_cache_memory is None
    assert args.swa_full_tokens_ratio == 0.8 and args.mamba_full_memory_ratio == 0.9


def test_server_args_are_frozen() -> None:
    args = ServerArgs()
    with pytest.raises(AttributeError):
        args.page_size = 16  # type: ignore[misc]


# ---- cross-field rules ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mem_fraction_static": 0.8, "kv_cache_memory": 1 << 30},
         "--mem-fraction-static and --kv-cache-memory both set the KV budget: give only one "
         "(got 0.8 and 1073741824 bytes)"),
        ({"max_total_tokens": 15, "page_size": 16},
         "--max-total-tokens 15 is below one page (--page-size 16); use at least 16"),
        ({"enable_dp_attention": True},
         "--enable-dp-attention needs --dp-size of at least 2"),
        ({"enable_dp_attention": True, "dp_size": 1, "tp_size": 4},
         "--enable-dp-attention needs --dp-size of at least 2"),
        ({"enable_dp_attention": True, "dp_size": 4, "tp_size": 6},
         "--tp-size 6 must be a multiple of --dp-size 4 with --enable-dp-attention; try --dp-size 3"),
        ({"speculative_algorithm": "EAGLE"},
         "--speculative-algorithm EAGLE needs --speculative-draft-model (a preset or a path)"),
        ({"speculative_algorithm": "EAGLE3"},
         "--speculative-algorithm EAGLE3 needs --speculative-draft-model"),
        ({"speculative_algorithm": "STANDALONE"},
         "--speculative-algorithm STANDALONE needs --speculative-draft-model"),
        ({"speculative_algorithm": "NEXTN", "speculative_draft_model": "x"},
         "--speculative-algorithm NEXTN drafts with the target's own next-token-prediction layers; "
         "drop --speculative-draft-model"),
        ({"speculative_algorithm": "NEXTN", "pp_size": 2},
         "--speculative-algorithm NEXTN is not supported with --pp-size 2; use --pp-size 1"),
        ({"speculative_num_steps": 2},
         "--speculative-num-steps given without --speculative-algorithm; set one (EAGLE, EAGLE3, STANDALONE, NEXTN)"),
        ({"speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B", "speculative_eagle_topk": 2},
         "--speculative-draft-model, --speculative-eagle-topk given without --speculative-algorithm"),
        ({"speculative_num_draft_tokens": 4},
         "--speculative-num-draft-tokens given without --speculative-algorithm"),
        # topk 1 (or unset) is a chain: draft tokens must be steps + 1; steps default to 3
        ({"speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 5},
         "--speculative-num-draft-tokens must be --speculative-num-steps + 1 = 4 (got 5)"),
        ({"speculative_algorithm": "NEXTN", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
          "speculative_num_draft_tokens": 5},
         "--speculative-num-draft-tokens must be --speculative-num-steps + 1 = 3 (got 5)"),
    ],
)
def test_cross_field_rules_name_the_flags(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerArgs.from_mapping(data)


def test_cross_field_rules_also_run_on_direct_construction() -> None:
    with pytest.raises(ConfigError, match="--mem-fraction-static and --kv-cache-memory both set"):
        ServerArgs(mem_fraction_static=0.5, kv_cache_memory=1)


@pytest.mark.parametrize(
    "data",
    [
        {"max_total_tokens": 16, "page_size": 16},  # exactly one page is allowed
        {"enable_dp_attention": True, "dp_size": 2, "tp_size": 8},
        {"dp_size": 3, "tp_size": 8},  # dp without dp-attention: no divisibility rule
        {"speculative_algorithm": "NEXTN"},
        {"speculative_algorithm": "EAGLE", "speculative_draft_model": "d", "speculative_num_steps": 5,
         "speculative_num_draft_tokens": 6},
        # topk > 1 is a tree: any number of draft tokens
        {"speculative_algorithm": "EAGLE", "speculative_draft_model": "d", "speculative_eagle_topk": 4,
         "speculative_num_draft_tokens": 8},
        {"mem_fraction_static": 0.88},
        {"kv_cache_memory": 1},
    ],
)
def test_consistent_combinations_are_accepted(data: dict[str, Any]) -> None:
    args = ServerArgs.from_mapping(data)
    for key, value in data.items():
        assert getattr(args, key) == value


@pytest.mark.parametrize(("tp", "dp"), [(3, 2), (5, 4), (7, 3)])
def test_the_suggested_dp_size_is_itself_accepted(tp: int, dp: int) -> None:
    with pytest.raises(ConfigError) as info:
        ServerArgs.from_mapping({"enable_dp_attention": True, "tp_size": tp, "dp_size": dp})
    # a prime tp has no divisor >= 2 below dp: the fix is the next tp that dp divides
    suggested = int(re.search(r"try --tp-size (\d+)", str(info.value)).group(1))  # type: ignore[union-attr]
    assert suggested == -(-tp // dp) * dp
    ServerArgs.from_mapping({"enable_dp_attention": True, "tp_size": suggested, "dp_size": dp})


# ---- files ------------------------------------------------------------------------------

FILE_SETTINGS = {"page_size": 16, "kv_cache_dtype": "fp8_e4m3", "mem_fraction_static": 0.85,
                 "tp_size": 2, "disable_radix_cache": True}


def _toml(settings: dict[str, Any], dashes: bool) -> str:
    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()
    return "".join(f"{k.replace('_', '-') if dashes else k} = {value(v)}\n" for k, v in settings.items())


@pytest.mark.parametrize("dashes", [False, True], ids=["underscores", "dashes"])
@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_from_file_reads_toml_and_json(tmp_path: Path, suffix: str, dashes: bool) -> None:
    path = tmp_path / f"server{suffix}"
    if suffix == ".toml":
        path.write_text(_toml(FILE_SETTINGS, dashes))
    else:
        path.write_text(json.dumps({(k.replace("_", "-") if dashes else k): v for k, v in FILE_SETTINGS.items()}))
    args = server_args_from_file(path)
    assert args == ServerArgs(**FILE_SETTINGS)
    assert server_args_from_file(str(path)) == args  # a str path works too


def test_read_settings_file_translates_dashes_in_keys(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('max-running-requests = 8\nswa-full-tokens-ratio = 0.5\n')
    assert read_settings_file(path) == {"max_running_requests": 8, "swa_full_tokens_ratio": 0.5}


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.toml", "page_size = = 3", r"config file .*bad\.toml is not valid TOML"),
        ("bad.json", "{page_size: 3", r"config file .*bad\.json is not valid JSON"),
        ("list.json", "[1, 2]", r"list\.json must hold a JSON object \(a TOML table\), not list"),
        ("value.toml", "page_size = 0", r"Expected `int` >= 1 - at `\$\.page_size`"),
        ("unknown.json", '{"max-model-len": 4096}',
         r"--max-model-len is vLLM's knob: add --engine vllm, or with SGLang's rules use --context-length"),
        ("override.json", '{"num-gpu-blocks-override": 4096}', r"override\.json: unknown setting "
         r"'num_gpu_blocks_override' \(num_gpu_blocks_override is vLLM's name; here use --max-total-tokens"),
        ("vllm.json", '{"gpu-memory-utilization": 0.9}',
         r"--gpu-memory-utilization is vLLM's knob: add --engine vllm, or with SGLang's rules use --mem-fraction-static"),
        ("rules.toml", "mem-fraction-static = 0.9\nkv-cache-memory = 1024\n", r"give only one"),
    ],
)
def test_from_file_errors_are_config_errors(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        server_args_from_file(path)


def test_from_file_on_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*nowhere\.toml"):
        server_args_from_file(tmp_path / "nowhere.toml")


# ---- replace() --------------------------------------------------------------------------

def test_replace_returns_a_changed_copy() -> None:
    base = ServerArgs(page_size=16, tp_size=2)
    changed = base.replace(page_size=64, kv_cache_dtype="fp8_e5m2")
    assert (changed.page_size, changed.tp_size, changed.kv_cache_dtype) == (64, 2, "fp8_e5m2")
    assert base.page_size == 16 and base.kv_cache_dtype == "auto"


@pytest.mark.parametrize(
    ("base", "changes", "message"),
    [
        ({}, {"page_size": 0}, "Expected `int` >= 1 - at `$.page_size`"),
        ({"mem_fraction_static": 0.8}, {"kv_cache_memory": 1 << 30}, "both set the KV budget"),
        ({"page_size": 64}, {"max_total_tokens": 32}, "--max-total-tokens 32 is below one page (--page-size 64)"),
        ({}, {"speculative_algorithm": "EAGLE"}, "needs --speculative-draft-model"),
        ({}, {"no_such_field": 1}, "unknown field `no_such_field`"),
    ],
)
def test_replace_revalidates(base: dict[str, Any], changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerArgs.from_mapping(base).replace(**changes)


def test_replace_can_clear_one_budget_knob_and_set_the_other() -> None:
    args = ServerArgs(mem_fraction_static=0.8).replace(mem_fraction_static=None, kv_cache_memory=4096)
    assert (args.mem_fraction_static, args.kv_cache_memory) == (None, 4096)


# ---- derived values ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("data", "attention_dp", "attention_tp"),
    [
        ({}, 1, 1),
        ({"tp_size": 8}, 1, 8),
        ({"tp_size": 8, "dp_size": 4}, 1, 8),  # dp without dp-attention leaves attention on all of TP
        ({"tp_size": 8, "dp_size": 4, "enable_dp_attention": True}, 4, 2),
        ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, 8, 1),
    ],
)
def test_attention_parallel_sizes(data: dict[str, Any], attention_dp: int, attention_tp: int) -> None:
    args = ServerArgs.from_mapping(data)
    assert (args.attention_dp_size, args.attention_tp_size) == (attention_dp, attention_tp)


@pytest.mark.parametrize(
    ("data", "speculative", "steps", "topk", "draft_tokens"),
    [
        ({}, False, 3, 1, 4),
        ({"speculative_algorithm": "NEXTN"}, True, 3, 1, 4),  # defaults: 3 steps, a chain of 3 + 1
        ({"speculative_algorithm": "NEXTN", "speculative_num_steps": 5}, True, 5, 1, 6),
        ({"speculative_algorithm": "EAGLE", "speculative_draft_model": "d", "speculative_num_steps": 1}, True, 1, 1, 2),
        ({"speculative_algorithm": "EAGLE", "speculative_draft_model": "d", "speculative_eagle_topk": 4,
          "speculative_num_draft_tokens": 16}, True, 3, 4, 16),
    ],
)
def test_speculative_defaults(data: dict[str, Any], speculative: bool, steps: int, topk: int, draft_tokens: int) -> None:
    args = ServerArgs.from_mapping(data)
    assert args.speculative is speculative
    assert args.resolved_speculative_num_steps == steps
    assert args.resolved_speculative_eagle_topk == topk
    assert args.resolved_speculative_num_draft_tokens == draft_tokens


def test_server_args_round_trip_through_json() -> None:
    args = ServerArgs(page_size=32, kv_cache_memory=123456789, speculative_algorithm="NEXTN")
    assert ServerArgs.from_mapping(json.loads(msgspec.json.encode(args))) == args


def test_the_rank_memory_ratio_default_is_the_one_sglang_constant() -> None:
    from kvcache.inputs.parallel import ParallelState
    from kvcache.inputs.sglang_ratios import SGLANG_MIN_RANK_MEMORY_RATIO

    assert ServerArgs().min_rank_memory_ratio == ParallelState().min_rank_memory_ratio == SGLANG_MIN_RANK_MEMORY_RATIO == 0.9


def test_the_hybrid_ratio_defaults_are_the_one_sglang_constant_each() -> None:
    """ServerArgs (float flags), SizingSettings and PlanRequest (exact fractions) all default to the planner's
    constants, which are SGLang 0.5.23's fallbacks 0.8 and 0.9."""
    from fractions import Fraction

    from kvcache.inputs.sglang_ratios import SGLANG_MAMBA_FULL_MEMORY_RATIO, SGLANG_SWA_FULL_TOKENS_RATIO
    from kvcache.sizing.plan_request import PlanRequest
    from kvcache.inputs.sizing_settings import SizingSettings

    assert (SGLANG_SWA_FULL_TOKENS_RATIO, SGLANG_MAMBA_FULL_MEMORY_RATIO) == (Fraction(4, 5), Fraction(9, 10))
    read = SizingSettings.from_server_args(ServerArgs())
    assert read.swa_full_tokens_ratio == SizingSettings().swa_full_tokens_ratio == SGLANG_SWA_FULL_TOKENS_RATIO
    assert read.mamba_full_memory_ratio == SizingSettings().mamba_full_memory_ratio == SGLANG_MAMBA_FULL_MEMORY_RATIO
    swa_ratio = next(f for f in msgspec.structs.fields(PlanRequest) if f.name == "swa_ratio")
    assert swa_ratio.default == SGLANG_SWA_FULL_TOKENS_RATIO


def test_a_settings_file_takes_sglangs_other_spellings_as_its_flags_do(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tensor_parallel_size and cuda_graph_max_bs_decode (SGLang 0.5.23's fields) were refused as unknown settings."""
    from kvcache.errors import ConfigError
    from kvcache.inputs.settings_file import read_settings_file

    path = tmp_path / "sglang.json"
    path.write_text('{"tensor_parallel_size": 2, "cuda_graph_max_bs_decode": 128, "page_size": 16}')
    assert read_settings_file(path) == {"tp_size": 2, "cuda_graph_max_bs": 128, "page_size": 16}
    path.write_text('{"tensor_parallel_size": 2, "tp_size": 4}')
    with pytest.raises(ConfigError, match="sets tp_size twice with different values"):
        read_settings_file(path)
