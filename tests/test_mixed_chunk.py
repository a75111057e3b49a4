"""--enable-mixed-chunk (SGLang's flag): accepted, sized as SGLang sizes it, and its mixed step measured."""

from __future__ import annotations

import json

import pytest

from app.cli import main
import torch

from kvcache.engines import engine_rules
from kvcache.inputs.dtypes import BFLOAT16, KV_CACHE_DTYPES
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.models.presets import load_model_config
from kvcache.sizing.worker_sizing import WorkerSizing

MODEL = "Llama-3.1-8B-Instruct"
PLAN = ["plan", "--gpu", "H200", "--model", MODEL, "--json"]


def _plan(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert main([*PLAN, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_mixed_chunk_keeps_sglangs_static_plan_and_its_measured_bootstrap_is_predicted(
        capsys: pytest.CaptureFixture[str]) -> None:
    plain, mixed = _plan(capsys), _plan(capsys, "--enable-mixed-chunk")
    # SGLang 0.5.23's reserve does not read the flag: the same fraction and tokens
    assert mixed["mem_fraction_static"] == plain["mem_fraction_static"] == 0.903
    assert mixed["static_plan_tokens"] == plain["static_plan_tokens"]
    # the mixed step is one of the measured worst-case steps: a measured bootstrap is predicted with it or without
    assert plain["measured_off"] is None and mixed["measured_off"] is None
    assert mixed["static_plan_tokens"] <= mixed["measured_prediction"]["tokens"]  # its bytes: test_worst_case_steps


def test_the_text_report_predicts_the_measured_bootstrap(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(PLAN[:-1] + ["--enable-mixed-chunk"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("measured bootstrap"))
    assert "off on this card" not in line


@pytest.mark.parametrize("resize", [False, True])
def test_eligibility_with_mixed_chunk_is_measured(resize: bool) -> None:
    answer = _cuda_sizing(enable_mixed_chunk=True, enable_post_capture_kv_resize=resize).post_capture_resize()
    assert answer.measured and answer.active and answer.not_measured == ""
    assert _cuda_sizing().post_capture_resize().measured


def test_vllm_refuses_sglangs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--engine", "vllm", "--enable-mixed-chunk"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--enable-mixed-chunk (no vLLM counterpart: drop it)" in err


def _cuda_sizing(**settings: bool) -> WorkerSizing:
    return WorkerSizing(settings=SizingSettings(context_length=8192, **settings), model_config=load_model_config(MODEL),
                        parallel_state=ParallelState(), model_dtype=BFLOAT16,
                        kv_cache_dtype=KV_CACHE_DTYPES["bfloat16"], device_type="cuda", engine=engine_rules("sglang"))


def test_measured_headroom_asked_for_explicitly_takes_mixed_steps(capsys: pytest.CaptureFixture[str]) -> None:
    report = _plan(capsys, "--kv-headroom", "measured", "--enable-mixed-chunk")
    assert report["measured_prediction"]["kv_headroom"] == "measured" and report["measured_off"] is None


def test_without_graph_padding_an_eager_decode_batch_is_predicted_below_the_largest_graph(
        capsys: pytest.CaptureFixture[str]) -> None:
    """200 running requests fit the 256-request graph; with padding off they decode eagerly: the prediction keeps
    their sampler's 4 B x 128,256 entries each more free (their activations stay under 2/5 of the prefill's, which
    the steps in turn already hold)."""
    padded = _plan(capsys, "--max-running-requests", "200")["measured_prediction"]
    eager = _plan(capsys, "--max-running-requests", "200", "--disable-cuda-graph-padding")["measured_prediction"]
    assert eager["needed_free_bytes"] - padded["needed_free_bytes"] == 200 * 4 * 128_256
    settings = SizingSettings(disable_cuda_graph_padding=True)
    assert settings.graph_served_batch(256) == 0 and SizingSettings().graph_served_batch(256) == 256
