"""A speculative draft that does not fit, on a device that builds pools: one line, exit 3, nothing left allocated.

The draft's weights load after the target's and before the target plans (app.engine.Engine), so the draft's
refusal cannot ask for the target's plan: its sizing is known before the target's cache exists (the configurator
takes that cache only when the draft configures). Bootstrap refused this with an internal error (exit 1) before.
"""

from __future__ import annotations

import gc
import json
import re

import pytest

from app.cli import main
from app.failures import failure_of
from kvcache.byte_units import format_bytes
from kvcache.errors import WeightsDoNotFitError
from kvcache.inputs.cards import card_of_size
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.presets import load_model_config
from kvcache.testing.arena_census import ArenaCensus
from kvcache.testing.faults import FaultInjector

# SmolLM2-135M drafting for itself (STANDALONE), a 64 MiB KV budget for 1,024-token requests
CPU_DRAFT = ["--device", "cpu", "--kv-cache-memory", "64MiB", "--context-length", "1024", "--max-running-requests", "8",
             "--speculative-algorithm", "STANDALONE", "--speculative-draft-model", "SmolLM2-135M"]
# SmolLM2-135M: 576 x 49,152 tied embedding 28,311,552 + 30 layers x (q 576x576 331,776 + k, v 2 x 576x192 221,184
# + o 331,776 + MLP 3 x 576x1536 2,654,208 + 2 norms 1,152 = 3,540,096) 106,202,880 + final norm 576 = 134,515,008
# parameters x 2 B (bf16) = 269,030,016 B, in one arena rounded up to 2 MiB: 129 x 2,097,152 = 270,532,608 B
SMOLLM2_WEIGHTS = 270_532_608
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B"]


def test_a_draft_whose_weights_do_not_fit_the_cpu_is_refused_in_one_line_and_frees_the_target(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--memory-limit 400MiB (419,430,400 B) holds the target's 270,532,608 B and plans its KV cache, leaving about
    148,897,792 B (give or take what the process grows or frees meanwhile): less than the draft's 270,532,608 B. The target's
    weights (the one arena built) are freed; the --memory-limit the line suggests starts both workers."""
    with ArenaCensus().installed() as census:
        assert main([*CPU_DRAFT, "--memory-limit", "400MiB", "--json"]) == 3
    gc.collect()
    assert census.made == 1 and census.alive() == 0  # the target's weights arena, released; no pool was built
    out, err = capsys.readouterr()
    assert err.count("\n") == 1
    error = json.loads(out)["error"]
    free = error["available_bytes"]  # the host probe's reading: it moves with what the process frees and grows
    assert error["needed_bytes"] == SMOLLM2_WEIGHTS and 0 < free < SMOLLM2_WEIGHTS
    assert err.startswith(f"kvcache: does not fit: SmolLM2-135M's draft weights (0.25 GiB ({SMOLLM2_WEIGHTS:,} B) on "
                          f"this rank) do not fit in the {format_bytes(free)} free on cpu")
    suggested = re.search(r"--memory-limit (\d+MiB)", err)
    assert suggested is not None, err
    assert main([*CPU_DRAFT, "--memory-limit", suggested.group(1)]) == 0  # the value it names works


def test_a_draft_pool_that_fails_after_the_target_built_its_pools_frees_both_workers(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The fourth arena (target weights, draft weights, target KV, then the draft's KV) runs out of memory: one
    line, exit 3, and the three arenas built before it are released."""
    with ArenaCensus().installed() as census, FaultInjector(point="arena", at=4).installed() as fault:
        assert main([*CPU_DRAFT, "--memory-limit", "2GiB"]) == 3
    gc.collect()
    assert fault.fired and census.made == 3 and census.alive() == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: does not fit: out of memory: building the KV pools")


def test_the_engine_refuses_a_draft_whose_weights_do_not_fit_as_plan_does(capsys: pytest.CaptureFixture[str]) -> None:
    """The engine's own bootstrap (the container, meta weights and pools on a 17 GiB card) refuses the EAGLE3 draft
    with plan's very line (tests/test_dry_run.py pins its numbers), not an internal error; nothing stays allocated."""
    from containers import EngineContainer

    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu-memory", "17GB", *EAGLE3]) == 3
    planned = capsys.readouterr().err
    server_args = ServerArgs.from_mapping({"device": "meta", "speculative_algorithm": "EAGLE3",
                                           "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"})
    container = EngineContainer(server_args=server_args, model_config=load_model_config("Llama-3.1-8B-Instruct"),
                                card=card_of_size("17GB"))
    with ArenaCensus().installed() as census, pytest.raises(WeightsDoNotFitError) as refused:
        try:
            container.engine().bootstrap()
        finally:
            container.shutdown_resources()
    assert failure_of(refused.value).line() + "\n" == planned
    assert "draft weights (1.77 GiB (1,902,116,864 B) on this rank)" in planned
    del container, refused
    gc.collect()
    assert census.made == 1 and census.alive() == 0  # the target's (meta) weights arena


def test_each_fix_named_for_a_draft_that_does_not_fit_starts_the_target_and_the_draft(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A fix for the draft must hold both workers: the target's 16.06 GB and the draft's 1.90 GB of weights and the
    target's plan with the draft's pool. Asked of the draft's weights alone it named --tp-size 4 and --gpu A10 (24 GB),
    where the target's plan then found nothing left for the KV cache."""
    base = ["plan", "--model", "Llama-3.1-8B-Instruct", *EAGLE3]
    assert main([*base, "--gpu-memory", "17GB"]) == 3
    err = capsys.readouterr().err
    tp = re.search(r"--tp-size (\d+) \(about [^;]* per rank, each request capped at ([\d,]+) tokens\)", err)
    card = re.search(r"--gpu (\S+) \(", err)
    assert tp is not None and card is not None, err
    assert tp.group(1) == "2"  # 8.41 GiB of both models' weights per rank on 17 GB
    assert main([*base, "--gpu-memory", "17GB", "--tp-size", tp.group(1), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    # At TP 2 a token costs the target's 32 layers x 2,048 B (4 of its 8 KV heads x 128 x K and V x 2 B) plus the
    # draft's 1 layer x 2,048 B (its 8 KV heads split the same way): 67,584 B. The promise charged the draft's layer
    # as TP 1 splits it (8 heads, 4,096 B: 69,632 B a token) and capped a request at 60,312 instead of 62,135.
    assert planned["bytes_per_token"] == 32 * 4 * 128 * 2 * 2 + 1 * 4 * 128 * 2 * 2 == 67_584
    assert tp.group(2) == f"{planned['max_total_num_tokens'] - 1:,}" == "62,135"  # the cap promised is the one planned
    assert main([*base, "--gpu", card.group(1), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_total_num_tokens"] > 131_072  # "one full-length request" at the model's 131,072 tokens


def test_a_target_refused_beside_its_draft_promises_what_the_tp_size_it_names_plans(
        capsys: pytest.CaptureFixture[str]) -> None:
    """On 18 GB the draft's weights fit but the target's KV cache does not: its --tp-size fix counts both workers'
    weights (8,032,092,160 + 1,002,438,656 = 9,034,530,816 B a rank at TP 2) and the draft's pool split at TP 2, so
    the cap it promises is what plan at that size holds (it promised 90,153 with the target's weights alone)."""
    base = ["plan", "--model", "Llama-3.1-8B-Instruct", *EAGLE3, "--gpu-memory", "18GB"]
    assert 8_032_092_160 + 1_002_438_656 == 9_034_530_816
    assert main(base) == 3
    err = capsys.readouterr().err
    assert "nothing is left for the KV cache" in err, err
    tp = re.search(r"--tp-size 2 \(about [\d.]+ GiB \(9,034,530,816 B\) per rank, each request capped at ([\d,]+) "
                   r"tokens\)", err)
    assert tp is not None, err
    assert main([*base, "--tp-size", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert int(tp.group(1).replace(",", "")) == plan["static_plan_tokens"] - 1 == 78_063
