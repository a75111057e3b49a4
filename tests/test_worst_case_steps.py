"""The worst-case steps vLLM 0.34's sizing warm-up runs and ours did not: the mixed chunk (--enable-mixed-chunk)
and MLA's chunked context. Each runs on the CPU through a tiny model's pools; the dry run adds their bytes by
formula (hand arithmetic below) until a card measures them."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from app.forward.worst_case import ReferenceWorstCaseStep
from containers import EngineContainer
from kvcache.byte_units import GiB, MiB
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.hf_config import model_config_from_hf
from kvcache.sizing.worst_case_shapes import mixed_chunk_riders, mla_context_tokens
from kvcache.testing import FixedMemoryProbe, tiny_model_config
from test_forward_decode import TINY_MLA


def _runner(model, **args):  # type: ignore[no-untyped-def]
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "mem_fraction_static": 0.5,
                                                                  **args}), model_config=model)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    return runner


def _run_spied(mocker, runner, step, name):  # type: ignore[no-untyped-def]
    import app.forward.worst_case as worst_case

    extend = mocker.spy(runner, "forward_extend")
    sampled = {f: mocker.spy(worst_case, f) for f in ("sample_with_logprobs", "sample_without_logprobs")}
    free_slots, free_rows = runner.token_to_kv_pool_allocator.available_size(), runner.req_to_token_pool.available_size()
    step.run(name)
    assert runner.token_to_kv_pool_allocator.available_size() == free_slots  # every request released
    assert runner.req_to_token_pool.available_size() == free_rows
    return extend.call_args.args[0], {f: [tuple(c.args[0].shape) for c in s.call_args_list] for f, s in sampled.items()}


def test_the_mixed_chunk_carries_every_other_running_request_one_token_each_inside_the_chunk(mocker):
    """6 running requests at most: 5 ride in a 100-token chunk (SGLang takes their tokens from the chunk), each
    over a one-token context; logits for the prefilled request's last token and each rider's, no logprobs."""
    runner = _runner(tiny_model_config(), max_running_requests=6)
    step = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=100, decode_batch=6, largest_graph_batch=4,
                                  mixed_chunk=True)
    assert step.names() == ("prefill_chunk", "eager_decode", "mixed_chunk") and step.mixed_riders == 5
    batch, sampled = _run_spied(mocker, runner, step, "mixed_chunk")
    assert batch.extend_lens_cpu == (95, 1, 1, 1, 1, 1) and batch.prefix_lens_cpu == (0, 1, 1, 1, 1, 1)
    assert batch.num_tokens == 100 and batch.logit_rows.tolist() == [94, 95, 96, 97, 98, 99]
    assert sampled == {"sample_with_logprobs": [], "sample_without_logprobs": [(6, 256)]}
    off = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=100, decode_batch=6, largest_graph_batch=4,
                                 mixed_chunk=False)
    assert "mixed_chunk" not in off.names()
    with pytest.raises(ValueError, match="no worst-case step 'mixed_chunk'"):
        off.run("mixed_chunk")


def test_riders_leave_the_chunk_a_token_and_fit_the_pool_in_whole_pages():
    assert mixed_chunk_riders(prefill_tokens=8192, decode_batch=3857, pool_tokens=892_219, page_size=1) == 3856
    assert mixed_chunk_riders(prefill_tokens=100, decode_batch=4096, pool_tokens=10**6, page_size=1) == 99
    # pool of 1,000 slots, chunk 900, pages of 16: a rider takes a page (16 slots) and frees one chunk token,
    # so 15 more slots each; (1,000 - 900 - 16) // 15 = 5
    assert mixed_chunk_riders(prefill_tokens=900, decode_batch=64, pool_tokens=1000, page_size=16) == 5
    assert mixed_chunk_riders(prefill_tokens=1, decode_batch=64, pool_tokens=1000, page_size=1) == 0  # no room
    assert mixed_chunk_riders(prefill_tokens=100, decode_batch=1, pool_tokens=1000, page_size=1) == 0  # no rider


def test_mixed_decode_riders_in_an_extend_step_attend_as_in_decode(mocker):
    """The riders' attention goes through the decode kernel in one batched call (not once per request)."""
    import app.forward.pool_attention as pool_attention

    runner = _runner(tiny_model_config(), max_running_requests=6)
    decode_attention = mocker.spy(pool_attention, "paged_decode_attention")
    step = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=100, decode_batch=6, largest_graph_batch=4,
                                  mixed_chunk=True)
    step.run("mixed_chunk")
    layers = runner.model_config.num_hidden_layers
    assert decode_attention.call_count == layers and decode_attention.call_args.args[0].shape[0] == 5


def test_mla_prefills_its_chunk_over_a_context_that_fills_sglangs_up_projection(mocker):
    """A context of 8,300 tokens and a 64-token chunk: 8,236 tokens of cached context (at least SGLang's 8,192
    threshold, under its 131,072 capacity), the chunk's last tokens asking prompt logprobs."""
    model = model_config_from_hf({**TINY_MLA, "max_position_embeddings": 8300}, name="tiny-mla")
    runner = _runner(model, max_running_requests=4)
    step = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=64, decode_batch=4, largest_graph_batch=4,
                                  mixed_chunk=False)
    assert step.names() == ("prefill_chunk", "mla_context") and step.context_tokens == 8300 - 64
    batch, sampled = _run_spied(mocker, runner, step, "mla_context")
    assert batch.prefix_lens_cpu == (8236,) and batch.extend_lens_cpu == (64,)
    assert batch.logit_rows.tolist() == list(range(64))  # a chunk under 2,048 tokens: every one
    assert sampled == {"sample_with_logprobs": [(64, 256)], "sample_without_logprobs": []}
    short = _runner(model_config_from_hf(TINY_MLA, name="tiny-mla"), max_running_requests=4)  # 256 tokens
    assert ReferenceWorstCaseStep(runner=short, chunked_prefill_size=64, decode_batch=4, largest_graph_batch=4,
                                  mixed_chunk=False).names() == ("prefill_chunk",)


def test_the_context_is_sglangs_capacity_or_what_one_request_can_hold_and_none_below_its_threshold():
    assert mla_context_tokens(prefill_tokens=8192, context_length=163_840, pool_tokens=10**7) == 131_072
    assert mla_context_tokens(prefill_tokens=8192, context_length=32_768, pool_tokens=10**7) == 24_576
    assert mla_context_tokens(prefill_tokens=8192, context_length=163_840, pool_tokens=20_000) == 11_808
    assert mla_context_tokens(prefill_tokens=8192, context_length=16_383, pool_tokens=10**7) == 0  # 8,191 < 8,192


def _prediction(capsys, model, *flags):  # type: ignore[no-untyped-def]
    assert main(["plan", "--model", model, "--gpu", "H200", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_mla_context_step_counts_131072_context_and_8192_chunk_tokens_up_projected(monkeypatch):
    """DeepSeek-V2-Lite on an H200 (chunk 8,192, context 163,840): 131,072 context + 8,192 chunk tokens, each
    up-projected in bf16 as 2 x (512 + 64 + 16 heads x (128 + 2 x 192 + 128 + 192)) = 27,776 B; plus the chunk's
    8,192 x 145 x 2,048 B of activations and 2,048 x 10 x 102,400 B of prompt logprobs: the formula, an upper bound
    (every tensor held at once), for a card no run measured the step on."""
    from kvcache.sizing import measured_prediction

    step = (131_072 + 8192) * 2 * (512 + 64 + 16 * (128 + 2 * 192 + 128 + 192)) + 8192 * 145 * 2048 \
        + 2048 * 10 * 102_400
    assert step == 8_398_045_184
    seen: dict[str, int] = {}
    formula = measured_prediction.added_step_bytes
    monkeypatch.setattr(measured_prediction, "added_step_bytes", lambda **kw: seen.update(formula(**kw)) or dict(seen))
    monkeypatch.setattr(measured_prediction, "measured_step", lambda *args: None)  # as before any card measured it
    assert main(["plan", "--model", "DeepSeek-V2-Lite", "--gpu", "H200", "--json"]) == 0
    assert seen == {"mla_context": step}


def test_a_step_measured_on_another_card_in_the_same_tensors_replaces_the_formula(capsys):
    """The H100 run of 2026-12-06 measured MLA's context step at 2,787,115,008 B where the formula counts
    8,398,045,184 B, the same count as on an H200 (same chunk, context and shapes): the H200's prediction takes the
    measured step, in turn with its recorded steps' 7,818,182,656 B (the larger plus 3/5 of the smaller), and says
    where it was measured; still uncalibrated (not this card's run)."""
    from kvcache.sizing.measured_calibration import calibration_for

    recorded, measured = 7_818_182_656, 2_787_115_008
    added = max(recorded, measured) + measured * 3 // 5 - recorded
    assert added == 1_672_269_004
    report = _prediction(capsys, "DeepSeek-V2-Lite")
    p = report["measured_prediction"]
    assert p["needed_free_bytes"] == calibration_for("H200", "DeepSeek-V2-Lite").kept_free_bytes + 64 * MiB + added
    assert p["basis"] == "uncalibrated" and p["source"].endswith(
        f"plus {added:,} B for the steps no recorded run ran on this card (mla_context: measured on H100-80GB, the "
        "same tensors)")
    assert report["static_plan_tokens"] < p["tokens"] < 3_365_683  # below the H200's run without the step


def test_mixed_chunk_is_measured_and_the_dry_run_adds_its_step(capsys):
    """Llama-3.1-8B on an H200: 3,857 requests, chunk 8,192: 3,856 ride. The step holds the chunk's
    8,192 x 54 x 4,096 B of activations and 3,857 rows x (6 + 4) B x 128,256 of logits and probabilities, in turn
    with the recorded steps' 8,166,309,888 B (the H200 run of 2026-12-06, sampled with logprobs)."""
    plain, mixed = _prediction(capsys, "Llama-3.1-8B-Instruct"), _prediction(capsys, "Llama-3.1-8B-Instruct",
                                                                             "--enable-mixed-chunk")
    assert mixed["static_plan_tokens"] == plain["static_plan_tokens"] and mixed["measured_off"] is None
    step = 8192 * 54 * 4096 + 3857 * 10 * 128_256
    recorded = 8_166_309_888
    added = max(recorded, step) + min(recorded, step) * 3 // 5 - recorded
    assert mixed["measured_prediction"]["needed_free_bytes"] - plain["measured_prediction"]["needed_free_bytes"] == added
    assert "(mixed_chunk)" in mixed["measured_prediction"]["source"] and not mixed["measured_prediction"]["calibrated"]
    assert plain["static_plan_tokens"] <= mixed["measured_prediction"]["tokens"] < plain["measured_prediction"]["tokens"]
