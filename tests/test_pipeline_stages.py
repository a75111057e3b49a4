"""Pipeline stages split as SGLang 0.5.23 splits them, a split given by hand (--pp-layer-partition), and what the
stages of a DeepSeek-V3 PP 8 plan hold and agree on, by hand.

SGLang's get_pp_indices (srt/distributed/utils.py) gives every stage num_layers // pp_size layers and one more to
each of the LAST num_layers % pp_size stages; SGLANG_PP_LAYER_PARTITION sets the counts by hand. Where the
reference tree is present (KVCACHE_REFERENCE_SRC), that function is read from it and called beside ours.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Tuple

import pytest

from app.cli import main
from kvcache.errors import ConfigError
from kvcache.inputs.cards import CUDA_CONTEXT_BYTES, CUDA_KERNEL_LOAD_BYTES, KNOWN_CARDS
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.pipeline_stages import stage_layer_counts, stage_layers
from kvcache.inputs.server_args import ServerArgs
from reference_sources import reference_src_holding

SGLANG_PP = "sglang/srt/distributed/utils.py"

# (layers, stages, partition by hand or None): presets' depths (Llama-3.1-8B 32, DeepSeek-V3 61, Qwen3-Next 48,
# gemma-2-9b 42, Llama-3.1-70B 80, Kimi-Linear 27, Jamba 32, a 3-layer test model) over even and uneven stage counts
PAIRS: list[tuple[int, int, tuple[int, ...] | None]] = [
    (32, 1, None), (32, 2, None), (32, 3, None), (61, 2, None), (61, 8, None), (61, 7, None), (48, 5, None),
    (42, 4, None), (80, 3, None), (80, 6, None), (27, 3, None), (27, 4, None), (3, 2, None), (95, 16, None),
    (61, 8, (8, 8, 8, 8, 8, 7, 7, 7)), (32, 3, (11, 11, 10)), (80, 4, (14, 22, 22, 22)), (61, 2, (1, 60)),
]


def _sglang_get_pp_indices(partition: tuple[int, ...] | None) -> Callable[[int, int, int], tuple[int, int]]:
    """SGLang 0.5.23's own get_pp_indices, read from the reference tree, with SGLANG_PP_LAYER_PARTITION as given."""
    root = reference_src_holding(SGLANG_PP, "SGLang 0.5.23")
    tree = ast.parse((root / SGLANG_PP).read_text())
    (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_pp_indices"]
    env = None if partition is None else ",".join(map(str, partition))
    namespace: dict[str, Any] = {"Tuple": Tuple, "os": SimpleNamespace(getenv=lambda name, default=None: (
        env if name == "SGLANG_PP_LAYER_PARTITION" else default))}
    exec(compile(ast.Module(body=[func], type_ignores=[]), SGLANG_PP, "exec"), namespace)  # noqa: S102
    return namespace["get_pp_indices"]


@pytest.mark.parametrize(("layers", "pp", "partition"), PAIRS)
def test_stages_equal_sglangs_get_pp_indices(layers: int, pp: int, partition: tuple[int, ...] | None) -> None:
    get_pp_indices = _sglang_get_pp_indices(partition)
    for rank in range(pp):
        ours = ParallelState(pp_size=pp, pp_rank=rank, pp_layer_partition=partition).layer_range(layers)
        assert (ours.start, ours.stop) == get_pp_indices(layers, rank, pp)


@pytest.mark.parametrize(("partition", "pp"), [((7, 7, 7, 8, 8, 8, 8), 8), ((7, 7, 7, 8, 8, 8, 8, 7), 8)])
def test_sglang_refuses_the_partitions_we_refuse(partition: tuple[int, ...], pp: int) -> None:
    with pytest.raises(ValueError, match="does not match"):
        _sglang_get_pp_indices(partition)(61, 0, pp)
    with pytest.raises(ConfigError):
        stage_layer_counts(61, pp, partition)


@pytest.mark.parametrize(("layers", "pp", "counts"), [
    (61, 8, (7, 7, 7, 8, 8, 8, 8, 8)),  # DeepSeek-V3: 61 = 8 x 7 + 5, the last 5 stages take one more
    (32, 3, (10, 11, 11)),  # Llama-3.1-8B: 32 = 3 x 10 + 2
    (32, 2, (16, 16)), (3, 2, (1, 2)), (27, 4, (6, 7, 7, 7)),
])
def test_the_extra_layers_go_to_the_last_stages(layers: int, pp: int, counts: tuple[int, ...]) -> None:
    assert stage_layer_counts(layers, pp) == counts
    assert [len(stage_layers(layers, pp, r)) for r in range(pp)] == list(counts)
    assert stage_layers(layers, pp, pp - 1).stop == layers  # contiguous, the last stage ends the model


def _plan(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict[str, Any] | str]:
    code = main(["plan", "--gpu", "H200", *flags, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else err


def test_a_partition_by_hand_sets_the_stages(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--pp-size", "3", "--pp-layer-partition", "11,11,10")
    assert code == 0 and isinstance(report, dict)
    assert [tuple(s["layers"]) for s in report["stages"]] == [(0, 11), (11, 22), (22, 32)]
    code, report = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--pp-size", "3")
    assert code == 0 and isinstance(report, dict)
    assert [tuple(s["layers"]) for s in report["stages"]] == [(0, 10), (10, 21), (21, 32)]


def test_a_settings_file_gives_the_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "s.toml"
    settings.write_text("pp-size = 3\npp-layer-partition = [12, 10, 10]\n")
    code, report = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--config", str(settings))
    assert code == 0 and isinstance(report, dict)
    assert [tuple(s["layers"]) for s in report["stages"]] == [(0, 12), (12, 22), (22, 32)]
    assert ServerArgs.from_mapping({"pp_size": 2, "pp_layer_partition": [16, 16]}).pp_layer_partition == (16, 16)


@pytest.mark.parametrize(("flags", "message"), [
    (["--pp-size", "8", "--pp-layer-partition", "7,7,7,8,8,8,8"],
     "--pp-layer-partition 7,7,7,8,8,8,8 has 7 entries for --pp-size 8; give 8 counts of at least 1 summing to 61, "
     "e.g. --pp-layer-partition 7,7,7,8,8,8,8,8 (SGLang's own split)"),
    (["--pp-size", "8", "--pp-layer-partition", "8,8,8,8,8,8,8,8"],
     "--pp-layer-partition 8,8,8,8,8,8,8,8 sums to 64 layers but the model has 61; give 8 counts of at least 1 "
     "summing to 61, e.g. --pp-layer-partition 7,7,7,8,8,8,8,8 (SGLang's own split)"),
    (["--pp-layer-partition", "30,31"],  # one stage: SGLang would ignore it; here it is not dropped unread
     "--pp-layer-partition 30,31 has 2 entries for --pp-size 1; give 1 counts of at least 1 summing to 61, "
     "e.g. --pp-layer-partition 61 (SGLang's own split)"),
])
def test_a_partition_that_is_not_the_models_is_refused_in_one_line(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _plan(capsys, "--model", "DeepSeek-V3", *flags)
    assert code == 2 and err == f"kvcache: error: {message}\n"


@pytest.mark.parametrize("value", ["7,,8", "7,0,8", "x"])
def test_a_partition_that_is_not_counts_is_refused_by_its_flag(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _plan(capsys, "--model", "DeepSeek-V3", "--pp-size", "3", "--pp-layer-partition", value)
    assert code == 2 and isinstance(err, str) and err.count("\n") == 1 and "--pp-layer-partition" in err


@pytest.mark.parametrize(("entries", "why"), [("[0, 32]", "expected int >= 1 at entry 0"),
                                              ("[-1, 33]", "expected int >= 1 at entry 0"),
                                              ("[true, 31]", "expected int, got bool at entry 0")])
def test_a_settings_files_partition_entry_is_refused_naming_the_file_key_flag_and_a_split(
        entries: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # msgspec names the entry as `$.pp_layer_partition[0]`: the line still names the file, the key and the flag;
    # 16,16 is SGLang's own split of Llama-3.1-8B's 32 layers over 2 stages, and it plans
    settings = tmp_path / "s.toml"
    settings.write_text(f"pp-size = 2\npp-layer-partition = {entries}\n")
    code, err = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--config", str(settings))
    assert code == 2 and isinstance(err, str) and err.count("\n") == 1 and "$." not in err
    assert f"config file {settings}: pp-layer-partition = " in err
    assert f"(--pp-layer-partition, ServerArgs.pp_layer_partition): {why}; " in err
    assert "e.g. pp-layer-partition = [16, 16] (SGLang's own split of 32 layers over --pp-size 2)" in err
    settings.write_text("pp-size = 2\npp-layer-partition = [16, 16]\n")
    assert _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--config", str(settings))[0] == 0


def test_a_settings_files_partition_example_is_the_models_own_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V3's 61 layers over 2 stages as SGLang 0.5.23's get_pp_indices splits them: 61 // 2 = 30, the one
    # left over on the last stage: [30, 31]; `fit` names the same split
    settings = tmp_path / "s.toml"
    settings.write_text("pp-size = 2\npp-layer-partition = [0, 61]\n")
    split = "e.g. pp-layer-partition = [30, 31] (SGLang's own split of 61 layers over --pp-size 2)"
    code, err = _plan(capsys, "--model", "DeepSeek-V3", "--config", str(settings))
    assert code == 2 and isinstance(err, str) and err.count("\n") == 1 and split in err
    assert main(["fit", "--model", "DeepSeek-V3", "--gpu", "H200", "--config", str(settings)]) == 2
    assert split in capsys.readouterr().err


def test_a_flags_partition_entry_below_one_names_the_entry_and_a_split(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--pp-size", "2", "--pp-layer-partition", "0,32")
    assert code == 2 and isinstance(err, str) and err.count("\n") == 1
    assert "argument --pp-layer-partition: entry 0 of '0,32': expected an integer >= 1" in err
    assert "e.g. 16,16 (32 layers over --pp-size 2)" in err
    assert _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--pp-size", "2", "--pp-layer-partition", "16,16")[0] == 0


def test_deepseek_v3_pp8_stages_and_agreed_tokens_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _plan(capsys, "--model", "DeepSeek-V3", "--pp-size", "8")
    assert code == 0 and isinstance(report, dict)
    stages = report["stages"]
    assert [s["layers"][1] - s["layers"][0] for s in stages] == [7, 7, 7, 8, 8, 8, 8, 8]
    # MLA: (kv_lora_rank 512 + rope 64) x 2 B = 1,152 B a layer
    assert [s["bytes_per_token"] for s in stages] == [7 * 1152] * 3 + [8 * 1152] * 5
    # every stage's memory lines add up: its free before load less its weights less the kernels its first weights
    # load (CUDA_KERNEL_LOAD_BYTES) is its free after load
    free_before = KNOWN_CARDS["H200"].budget_total_bytes - CUDA_CONTEXT_BYTES  # cudaMemGetInfo's, measured
    assert free_before == 149_458_911_232
    for s in stages:
        assert s["free_before_load_bytes"] == free_before
        assert s["free_after_load_bytes"] == free_before - s["weights_bytes"] - CUDA_KERNEL_LOAD_BYTES
    # stage 0's report is its own: its weights with its own readings, and the smallest (stage 7's: 8 MoE layers
    # and the lm_head) that every stage's budget reads
    assert report["weights_bytes"] == stages[0]["weights_bytes"]
    assert report["free_after_load_bytes"] == stages[0]["free_after_load_bytes"]
    tightest = min(s["free_after_load_bytes"] for s in stages)
    assert tightest == stages[7]["free_after_load_bytes"] == 55_412_129_792
    assert report["ranks_smallest_memory"]["free_after_load_bytes"] == tightest
    # mem_fraction_static: 512 + 1.5 x 8,192 + 1 x 8 / 8 x 1,024 + 2 x 256 (no prefill graphs at PP > 1) = 14,336 MiB
    # of the card: 0.900 on either total of an H200 (143,771 MiB by nvidia-smi: 0.90029; 143,155.875 by cudaMemGetInfo:
    # 0.89985); the budget keeps round(149,458,911,232 x 0.1) = 14,945,891,123 free
    assert report["mem_fraction_static"] == 0.9
    budget = tightest - 14_945_891_123
    assert budget == report["budget_bytes"] == 40_466_238_669
    # an 8-layer stage's plan: the largest T with its arena (a 2 MiB multiple) inside the budget, holding
    #   the KV pool (T + 1 padding token) x 9,216 B; two free logs of 2 x 8 B a token (512-B slots);
    #   the request table: min(max(T x 512 // 163,840, 2,048), 4,096) = 4,096 rows + 1, of 163,840 + 4 int32
    table = -(-(4097 * 163_844 * 4) // 512) * 512
    assert table == 2_685_075_968
    room = budget // (2 << 20) * (2 << 20)
    tokens = (room - table - 9216) // (9216 + 2 * 16)
    assert tokens == 4_085_149
    assert (tokens + 1) * 9216 + 2 * (-(-16 * tokens // 512) * 512) + table <= room
    assert (tokens + 2) * 9216 + 2 * (-(-16 * (tokens + 1) // 512) * 512) + table > room
    # the 7-layer stages hold more alone; every stage keeps the 8-layer stages' count
    assert [s["own_max_total_num_tokens"] for s in stages] == [(room - table - 8064) // (8064 + 32)] * 3 + [tokens] * 5
    assert report["max_total_num_tokens"] == tokens and all(s["max_total_num_tokens"] == tokens for s in stages)
