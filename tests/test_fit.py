"""`fit`: every cell is the plan `plan` prints for the same flags; the cheapest row; the JSON schema; bad input."""

from __future__ import annotations

import io
import json
from fractions import Fraction
from pathlib import Path

import pytest

import app.fit_command as fit_command
from app.cli import main
from app.fit_sweep import FitRow, FitSweep, FitTarget, closest, ordered
from kvcache.inputs.cards import card_named
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.models.presets import load_model_config
from kvcache.sizing.planning import candidate_plan, requests_at_context
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest

CORPUS = Path(__file__).parent / "model_corpus"
LLAMA_70B = str(CORPUS / "Meta-Llama-3.1-70B.json")


# ---- every cell is `plan` -------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "card", "tp", "dtype", "context"), [
    ("Llama-3.1-8B-Instruct", "L40S", 1, "auto", 32768),  # GQA
    ("DeepSeek-V2-Lite", "H100-80GB", 2, "fp8_e4m3", 16384),  # MLA
    ("gpt-oss-20b", "A100-40GB", 1, "auto", 8192),  # paired sliding-window pool
    ("Qwen3-Next-80B-A3B-Thinking", "H200", 4, "auto", None),  # gated delta net state slots
    ("Nemotron-H-56B-Base-8K", "H200", 2, "fp8_e4m3", None),  # Mamba-2 hybrid
    ("gemma-2-9b-it", "L40S", 1, "auto", 4096),  # sliding windows
])
def test_a_cell_is_the_plan_for_the_same_flags(model: str, card: str, tp: int, dtype: str, context: int | None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--tp-size", str(tp), "--kv-cache-dtype", dtype] + (["--context-length", str(context)] if context else [])
    assert main(["plan", "--model", model, "--gpu", card, "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    sweep = FitSweep(model=load_model_config(model), settings={}, target=FitTarget(tokens=1, context_length=context))
    row = sweep.cell(card_named(card), tp, 1, dtype)
    assert row.fits and row.outcome == "fits"
    assert (row.max_total_tokens, row.max_running_requests, row.budget_bytes, row.weights_bytes) == (
        report["max_total_num_tokens"], report["max_running_requests"], report["budget_bytes"], report["weights_bytes"])
    assert row.context_length == report["plan"]["context_length"]
    assert row.kv_cache_dtype_resolved == report["kv_cache_dtype"]


@pytest.mark.parametrize(("card", "tp", "context", "outcome", "needed_gib"), [
    ("L4", 1, 32768, "weights", "131.42"),  # the weights alone: 131.42 GiB
    ("A100-80GB", 2, 32768, "one_request", None),  # the budget left holds 71 tokens
])
def test_a_cell_that_plan_refuses_is_refused_for_the_same_reason(
        card: str, tp: int, context: int, outcome: str, needed_gib: str | None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`plan` refuses weights that do not fit; a pool shorter than one request it plans as SGLang runs it (each
    request capped at the pool less one token), and `fit`, asked for requests of the context, says no for that."""
    assert main(["plan", "--model", LLAMA_70B, "--gpu", card, "--tp-size", str(tp),
                 "--context-length", str(context)]) == (3 if needed_gib else 0)
    out, refusal = capsys.readouterr()
    sweep = FitSweep(model=load_model_config(LLAMA_70B), settings={}, target=FitTarget(tokens=1, context_length=context))
    row = sweep.cell(card_named(card), tp, 1, "auto")
    assert not row.fits and row.outcome == outcome and row.max_total_tokens is None
    if needed_gib:
        assert f"weights ({needed_gib} GiB" in refusal and f"weights {needed_gib} GiB per GPU" in row.why_not
    else:
        assert "one request can hold at most 70 tokens" in out and "holds 71 tokens" in row.why_not


def test_flags_besides_the_swept_ones_reach_every_cell(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--page-size", "16", "--mem-fraction-static", "0.8", "--context-length", "8192"]
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--json", *flags]) == 0
    planned = json.loads(capsys.readouterr().out)["max_total_num_tokens"]
    assert main(["fit", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--tp-size", "1",
                 "--kv-cache-dtype", "auto", "--requests", "1", "--json", *flags]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["max_total_tokens"] == planned and planned % 16 == 0


@pytest.mark.parametrize(("model", "card", "pp", "tokens"), [
    ("DeepSeek-V3", "H200", 8, 4_085_149),  # stages as SGLang 0.5.23 splits them: 7,7,7,8,8,8,8,8 layers
    (str(CORPUS / "Jamba-v0.1.json"), "H200", 3, 5_820_513),  # a Mamba hybrid: 10,11,11 layers
    (str(CORPUS / "Kimi-Linear-48B-A3B-Instruct.json"), "H100-80GB", 3, 5_110_912),  # KDA + MLA: 8,531,664
])
def test_pipeline_cells_hold_the_smallest_stage_s_tokens(model: str, card: str, pp: int, tokens: int) -> None:
    """Every rank keeps the smallest stage's tokens (the stage minima of issue 22, worked out per stage)."""
    sweep = FitSweep(model=load_model_config(model), settings={}, target=FitTarget(tokens=tokens))
    row = sweep.cell(card_named(card), 1, pp, "auto")
    assert (row.max_total_tokens, row.fits, row.headroom, row.gpus) == (tokens, True, 1.0, pp)


# ---- requests held at a context length -----------------------------------------------------------------

def _request(context: int, pools: tuple[KVPoolDemand, ...]) -> PlanRequest:
    budget = MemoryBudget(budget_bytes=1 << 40, total_bytes=1 << 40, free_before_load_bytes=1 << 40,
                          free_after_load_bytes=1 << 40, mem_fraction_static=None, kv_cache_memory_bytes=1 << 40)
    return PlanRequest(budget=budget, page_size=1, context_length=context, req_to_token_row_width=context,
                       kv_pools=pools, swa_ratio=Fraction(3, 10))


FULL = KVPoolDemand(name="full", kind="full", num_layers=1, bytes_per_token=1)
WINDOW = KVPoolDemand(name="swa", kind="swa", num_layers=1, bytes_per_token=1, window=4096, share="swa")


@pytest.mark.parametrize(("context", "pools", "held"), [
    (32768, (FULL,), 100_000 // 32768),  # 3: the full pool binds
    (8192, (FULL, WINDOW), 30_000 // (4096 + 1)),  # 7: the window pool (30,000 tokens) binds, a window and a page each
    (32768, (FULL, WINDOW), 100_000 // 32768),  # 3: the full pool binds again
])
def test_requests_held_at_a_context_length_by_hand(context: int, pools: tuple[KVPoolDemand, ...], held: int) -> None:
    request = _request(context, pools)
    plan = candidate_plan(request, 100_000, 0)
    assert plan.max_running_requests >= 2048  # clamp(100,000 / context x 512, 2048, 4096): not the binding cap
    assert requests_at_context(request, plan) == held


# ---- the cheapest row ------------------------------------------------------------------------------------

def _row(card: str, gpus: int, headroom: float | None, outcome: str = "fits", card_gib: int = 80) -> FitRow:
    return FitRow(card=card, card_bytes=card_gib << 30, tp_size=gpus, pp_size=1, gpus=gpus, kv_cache_dtype="auto",
                  kv_cache_dtype_resolved="bfloat16", fits=outcome == "fits", outcome=outcome,  # type: ignore[arg-type]
                  needed_bytes=None, available_bytes=None,
                  why_not="" if outcome == "fits" else "short", weights_bytes=1, budget_bytes=1, max_total_tokens=1,
                  static_plan_tokens=1, tokens_source="static_plan",
                  max_running_requests=1, context_length=1, requests_at_context=1, headroom=headroom)


def test_the_cheapest_row_is_the_fewest_gpus_then_the_least_headroom() -> None:
    rows = [_row("big", 8, 3.0), _row("roomy", 4, 2.5), _row("tight", 4, 1.1), _row("short", 2, 0.9, "target"),
            _row("same-but-larger", 4, 1.1, card_gib=141), _row("none", 1, None, "weights")]
    table = ordered(rows)
    assert [r.card for r in table] == ["tight", "same-but-larger", "roomy", "big", "none", "short"]
    assert [r.card for r in table if r.cheapest] == ["tight"]
    assert closest(rows) is None or closest(rows).card == "short"  # type: ignore[union-attr]


def test_nothing_fits_is_exit_3_naming_the_closest_row(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fit", "--model", LLAMA_70B, "--gpu", "H100-80GB", "--tp-size", "1,2", "--kv-cache-dtype", "auto",
                 "--requests", "64", "--context-length", "32768"])
    out, err = capsys.readouterr()
    assert code == 3 and "*" not in out.splitlines()[1]
    assert err.count("\n") == 1 and err.startswith("kvcache: does not fit: no cell of the sweep serves 64 requests")
    # TP 1 does not hold the weights (131.42 GiB); at TP 2 they leave 13.24 GiB where the runtime keeps 13.60: closer
    assert "closest: 2 x H100-80GB (TP 2, PP 1, KV auto): after loading weights nothing is left for the KV cache" in err
    assert "free memory fell by 65.80 GiB" in err
    # no H100 at TP up to 64 holds 64 x 32K in bf16 KV (TP 8 holds 37; past 8 the 8 KV heads are copied, not split):
    # the first that does, planned by the same sweep, is 8 x H200
    assert err.rstrip().endswith("what would work: --gpu H200 --tp-size 8 (8 x H200, TP 8, PP 1, KV auto serve it)")
    assert main(["fit", "--model", LLAMA_70B, "--gpu", "H200", "--tp-size", "8", "--kv-cache-dtype", "auto",
                 "--requests", "64", "--context-length", "32768"]) == 0


def test_a_real_sweep_marks_the_cheapest_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--model", LLAMA_70B, "--gpu", "H100-80GB,H200", "--tp-size", "2,4,8",
                 "--requests", "64", "--context-length", "32768", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    fitting = [r for r in result["rows"] if r["fits"]]
    assert all(r["requests_at_context"] >= 64 for r in fitting)
    assert all(r["requests_at_context"] < 64 for r in result["rows"] if r["outcome"] == "target")
    fewest = min(r["gpus"] for r in fitting)
    best = min((r for r in fitting if r["gpus"] == fewest), key=lambda r: r["headroom"])
    assert result["cheapest"] == best and best["cheapest"] and result["rows"][0] == best
    # an H200 at TP 4 holds 64 x 32K only with fp8 KV (bf16 holds 36)
    assert (best["card"], best["tp_size"], best["kv_cache_dtype"]) == ("H200", 4, "fp8_e4m3")


# ---- --json ----------------------------------------------------------------------------------------------

ROW_KEYS = {"card", "card_bytes", "tp_size", "pp_size", "gpus", "kv_cache_dtype", "kv_cache_dtype_resolved", "fits",
            "outcome", "why_not", "needed_bytes", "available_bytes", "weights_bytes", "budget_bytes",
            "max_total_tokens", "static_plan_tokens", "tokens_source", "max_running_requests", "context_length", "requests_at_context", "headroom", "cheapest"}


def test_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--model", "SmolLM2-135M", "--gpu", "L4,A10", "--tp-size", "1,2", "--tokens", "1000000",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"schema", "model", "target", "context_length", "space", "rows", "cheapest", "closest",
                           "error"}
    assert result["schema"] == "kvcache-fit/2" and result["error"] is None and result["closest"] is None
    assert result["target"] == {"requests": None, "tokens": 1_000_000, "context_length": None}
    assert result["space"] == {"cards": ["L4", "A10"], "tp_sizes": [1, 2], "pp_sizes": [1],
                               "kv_cache_dtypes": ["auto", "fp8_e4m3"]}
    assert len(result["rows"]) == 8 and all(set(r) == ROW_KEYS for r in result["rows"])
    assert result["context_length"] == 8192  # SmolLM2's max_position_embeddings, every cell's context
    invalid = [r for r in result["rows"] if r["outcome"] == "invalid"]
    assert len(invalid) == 4 and all(r["tp_size"] == 2 and "--tp-size" in r["why_not"] for r in invalid)  # 9 heads
    for r in result["rows"]:
        assert r["fits"] == (r["outcome"] == "fits") and (r["why_not"] == "") == r["fits"]
        assert r["gpus"] == r["tp_size"] * r["pp_size"]
        for key in ("card_bytes", "weights_bytes", "budget_bytes", "max_total_tokens"):
            assert r[key] is None or isinstance(r[key], int)
        if r["fits"]:
            assert r["max_total_tokens"] >= 1_000_000 and r["headroom"] == r["max_total_tokens"] / 1_000_000


# ---- bad input: one line, exit 2 ----------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "says"), [
    (["--requests", "8"], "--requests 8 needs --context-length C"),
    ([], "fit needs one target"),
    (["--tokens", "10", "--requests", "2", "--context-length", "64"], "fit needs one target"),
    (["--tokens", "10", "--tp-size", "0,2"], "--tp-size '0,2': '0' is not a positive integer"),
    (["--tokens", "10", "--tp-size", "1,,2"], "give values separated by commas"),
    (["--tokens", "10", "--kv-cache-dtype", "auto,fp9"], "'fp9' is not one of"),
    (["--tokens", "10", "--gpu", "L4,H100"], "unknown card 'H100'"),
    (["--tokens", "10", "--plot", "chart.jpg"], "--plot chart.jpg: the file must end in .png or .svg"),
    (["--tokens", "0"], "expected a positive integer, got '0'"),
    (["--tokens", "10", "--tp-size", "7"], "--tp-size"),  # 7 divides no layout of SmolLM2's 9 heads: every cell
    (["--tokens", "10", "--context-length", "999999"], "--context-length 999999 is longer than"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--model", "SmolLM2-135M", *args, *([] if "--gpu" in args else ["--gpu", "L4"])]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err


# ---- the progress line -----------------------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_on_a_terminal_once_the_sweep_is_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit_command, "PROGRESS_AFTER_S", 0.0)
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        progress = fit_command.Progress(stream)
        progress(1, 2)
        progress.clear()
    assert terminal.getvalue() == "\rfit: 1/2 cells\r\033[K" and pipe.getvalue() == ""
    monkeypatch.setattr(fit_command, "PROGRESS_AFTER_S", 60.0)
    quick = fit_command.Progress(terminal := _Terminal())
    quick(1, 2)
    quick.clear()
    assert terminal.getvalue() == ""


# ---- the README's example ---------------------------------------------------------------------------------------

def test_the_readmes_fit_example_is_what_fit_prints(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Path(__file__).parents[1]
    monkeypatch.chdir(repo)  # the example's --model is a path from the repository's root
    readme = (repo / "README.md").read_text()
    block = readme.split("$ python -m app fit ", 1)[1].split("```", 1)[0]
    command, printed = block.split("\n", 2)[:2], block.split("\n", 2)[2]
    args = " ".join(line.strip().rstrip("\\") for line in command).split()
    assert main(["fit", *args]) == 0
    assert capsys.readouterr().out == printed


def test_engine_sglang_is_the_sweep_as_without_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--model", "SmolLM2-135M", "--gpu", "L4", "--tokens", "10", "--engine", "sglang", "--json"]) == 0
    with_flag = json.loads(capsys.readouterr().out)["rows"]
    assert main(["fit", "--model", "SmolLM2-135M", "--gpu", "L4", "--tokens", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == with_flag


@pytest.mark.parametrize(("model", "card", "tp", "dtype", "length"), [
    ("Qwen3-8B", "H200", 1, "fp8", 32768),
    ("Nemotron-H-56B-Base-8K", "H200", 2, "auto", 8192),  # Mamba groups in align mode (prefix caching on)
    ("DeepSeek-V2-Lite", "H100-80GB", 2, "auto", 16384),  # MLA
])
def test_a_vllm_cell_is_plan_engine_vllms_answer(model: str, card: str, tp: int, dtype: str, length: int,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """fit --engine vllm answers each cell with vLLM 0.34.0's rules, the numbers `plan --engine vllm` prints: its
    budget and KV cache size; the requests held are its whole requests besides the null block, at most max_num_seqs."""
    flags = ["--engine", "vllm", "--tp-size", str(tp), "--kv-cache-dtype", dtype, "--max-model-len", str(length)]
    assert main(["plan", "--model", model, "--gpu", card, "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["fit", "--model", model, "--gpu", card, "--requests", "1", "--json", *flags]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    a = report["vllm"]
    assert (row["budget_bytes"], row["max_total_tokens"], row["weights_bytes"], row["max_running_requests"]) == \
        (report["budget_bytes"], report["max_total_num_tokens"], report["weights_bytes"], report["max_running_requests"])
    assert row["requests_at_context"] == min((a["num_gpu_blocks"] - 1) // a["blocks_per_request"], a["max_num_seqs"])
    assert (row["tokens_source"], row["fits"], row["context_length"]) == ("vllm_answer", True, length)


def test_fit_engine_vllm_sweeps_with_vllms_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Qwen3-8B at 32,768 tokens on an H200: a request of fp8 KV at TP 1 is 73,728 B x 32,768 = 2.25 GiB, and about
    # 111 GiB of KV memory hold 49 of them; at TP 2 each rank holds half the heads (1.125 GiB a request), 105: the
    # cheapest cell that holds 64 is 2 GPUs with fp8
    argv = ["fit", "--model", "Qwen3-8B", "--gpu", "H200", "--engine", "vllm", "--requests", "64", "--json"]
    assert main([*argv, "--max-model-len", "32768"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["rows"]) == 8 and all(r["tokens_source"] == "vllm_answer" for r in result["rows"])
    cheapest = result["cheapest"]
    assert (cheapest["gpus"], cheapest["kv_cache_dtype"], cheapest["requests_at_context"]) == (2, "fp8", 105)
    one_gpu = [r for r in result["rows"] if r["gpus"] == 1 and r["kv_cache_dtype"] == "fp8"]
    assert [(r["requests_at_context"], r["outcome"]) for r in one_gpu] == [(49, "target")]
    # vLLM's running cap, max_num_seqs, below the target is lifted first (then the fewest GPUs that serve it)
    assert main([*argv, "--max-model-len", "32768", "--tp-size", "1", "--max-num-seqs", "16"]) == 3
    assert "what would work: --max-num-seqs 64 --tp-size 2 (2 x H200" in capsys.readouterr().err
    assert main([*argv, "--max-model-len", "32768", "--tp-size", "2", "--max-num-seqs", "64"]) == 0
    capsys.readouterr()
    # vLLM spells e4m3 KV fp8 (its fp8_e4m3 picks another sparse-MLA backend): the default list and a settings file
    assert result["space"]["kv_cache_dtypes"] == ["auto", "fp8"]
    settings = tmp_path / "vllm.toml"
    settings.write_text('engine = "vllm"\nkv_cache_dtype = "fp8"\nmax_model_len = 32768\n')
    assert main(["fit", "--model", "Qwen3-8B", "--gpu", "H200", "--requests", "64", "--config", str(settings),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["space"]["kv_cache_dtypes"] == ["fp8"]
    assert main([*argv, "--context-length", "32768"]) == 2  # SGLang's name, under vLLM's rules
    assert "--context-length (use --max-model-len)" in capsys.readouterr().err
    assert main(argv) == 2
    assert "--requests 64 needs --max-model-len C" in capsys.readouterr().err


@pytest.mark.parametrize(("sizes", "fits"), [(["--pp-size", "1,2"], "2"), ([], "2"), (["--pp-size", "1,2,4"], "2")])
def test_a_partition_for_one_pp_size_is_refused_up_front_naming_the_sizes_it_fits(
        sizes: list[str], fits: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 8 + 24 = Llama-3.1-8B's 32 layers over 2 stages: no other PP size can take it, and each of those cells read
    # "no: layout" while the command exited 0 (`plan` refuses the same mismatch in one line)
    flags = ["fit", "--model", "Llama-3.1-8B-Instruct", "--requests", "64", "--context-length", "32768",
             "--gpu", "H200", "--pp-layer-partition", "8,24"]
    assert main([*flags, *sizes]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert "--pp-layer-partition 8,24 splits the layers over 2 stages, so the sweep's --pp-size " in out.err
    assert f"cannot take it; use --pp-size {fits}," in out.err
    assert main([*flags, "--pp-size", fits, "--json"]) == 0
    assert {row["pp_size"] for row in json.loads(capsys.readouterr().out)["rows"]} == {2}
