"""Measured headroom: the decision from a measured peak (pure), the worst-case step provider and its fake.

The measured bootstrap itself needs CUDA (tests/test_cuda_measured_headroom.py); here the
numbers are checked by hand on small plans, and the reference step runs on the CPU.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from dependency_injector import providers

from app.forward.worst_case import ReferenceWorstCaseStep
from containers import EngineContainer
from kvcache.inputs.dtypes import BFLOAT16
from kvcache.errors import DoesNotFitError, UnsupportedModelError
from kvcache.byte_units import GiB, MiB
from kvcache.inputs.server_args import ServerArgs
from kvcache.sizing.memory_budget import MemoryBudget
from kvcache.runtime.measured_headroom import (
    MeasuredSizing, StepPeak, decide_measured_tokens,
)
from kvcache.sizing.measured_prediction import measured_margin_bytes
from kvcache.sizing.resized_plan import resized_plan_request
from kvcache.sizing.planning import plan_cost, plan_pool_sizes
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest
from kvcache.testing import FixedActivationStep, FixedMemoryProbe, tiny_model_config

BPT = 256


def _plan(budget: int) -> object:
    b = MemoryBudget(budget_bytes=budget, total_bytes=GiB, free_before_load_bytes=GiB,
                     free_after_load_bytes=GiB - 8 * MiB, mem_fraction_static=0.9, kv_cache_memory_bytes=None)
    pools = (KVPoolDemand(name="full", kind="full", num_layers=2, bytes_per_token=BPT),)
    return plan_pool_sizes(PlanRequest(budget=b, page_size=1, context_length=256, req_to_token_row_width=256,
                                       kv_pools=pools, max_running_requests=64))


BUILT, STATIC = _plan(96 * MiB), _plan(64 * MiB)


def test_the_margin_is_half_a_percent_of_the_card_and_at_least_256_mib():
    assert measured_margin_bytes(150_109_880_320) == 750_549_401  # an H200: 0.5%
    assert measured_margin_bytes(16 * GiB) == 256 * MiB  # 0.5% would be 82 MiB


def test_free_memory_above_peak_and_margin_grows_the_pools_to_leave_exactly_that_free():
    free, peak, margin, slack = 40 * MiB, 6 * MiB, 2 * MiB, MiB
    after, note = decide_measured_tokens(built=BUILT, static=STATIC, free_at_static_bytes=free, peak_bytes=peak,
                                         margin_bytes=margin, mapping_slack_bytes=slack)
    budget = STATIC.total_bytes + free - peak - margin - slack  # what the pools may grow into
    assert note == "" and after.total_bytes <= budget
    assert plan_cost(resized_plan_request(BUILT, budget), after.max_total_num_tokens + 1, 0) > budget  # the largest
    assert STATIC.max_total_num_tokens < after.max_total_num_tokens < BUILT.max_total_num_tokens


def test_never_more_than_the_pools_were_built_for():
    after, _ = decide_measured_tokens(built=BUILT, static=STATIC, free_at_static_bytes=GiB, peak_bytes=MiB,
                                      margin_bytes=MiB, mapping_slack_bytes=0)
    assert after.max_total_num_tokens == BUILT.max_total_num_tokens


def test_a_peak_above_the_margin_but_below_what_the_static_plan_leaves_keeps_the_static_plan():
    after, note = decide_measured_tokens(built=BUILT, static=STATIC, free_at_static_bytes=10 * MiB,
                                         peak_bytes=9 * MiB, margin_bytes=4 * MiB, mapping_slack_bytes=0)
    assert after is STATIC and note.startswith(f"kept the static plan's {STATIC.max_total_num_tokens:,} tokens")


def test_a_peak_the_static_plan_cannot_hold_shrinks_below_it_and_says_so_with_the_bytes():
    after, note = decide_measured_tokens(built=BUILT, static=STATIC, free_at_static_bytes=10 * MiB,
                                         peak_bytes=30 * MiB, margin_bytes=2 * MiB, mapping_slack_bytes=0)
    assert after.max_total_num_tokens < STATIC.max_total_num_tokens
    assert f"leaves {10 * MiB:,} B free and the step needs {30 * MiB:,} B" in note
    with pytest.raises(DoesNotFitError, match="would run out of memory at the worst-case step"):
        decide_measured_tokens(built=BUILT, static=STATIC, free_at_static_bytes=MiB, peak_bytes=GiB,
                               margin_bytes=MiB, mapping_slack_bytes=0)


def test_a_step_peak_is_the_larger_reading_and_the_decision_reports_what_is_idle():
    steps = (StepPeak(name="prefill_chunk", torch_peak_bytes=100, free_drop_bytes=130, lasting_bytes=20),
             StepPeak(name="eager_decode", torch_peak_bytes=300, free_drop_bytes=290, lasting_bytes=0))
    m = MeasuredSizing(steps=steps, graph_bytes=7, margin_bytes=50, tokens_built=9, static_tokens=5, tokens_after=8,
                       free_after_steps_bytes=1000, plan_after=STATIC, note="", free_after_resize_bytes=420)
    assert [s.peak_bytes for s in steps] == [110, 300]
    assert (m.peak_bytes, m.worst_step, m.headroom_bytes, m.idle_bytes) == (300, "eager_decode", 350, 120)
    assert m.to_dict()["steps"]["prefill_chunk"] == {"peak_bytes": 110, "torch_peak_bytes": 100,
                                                     "free_drop_bytes": 130, "lasting_bytes": 20}


def _cpu_runner(**args):  # type: ignore[no-untyped-def]
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "max_running_requests": 6,
                                                                  "mem_fraction_static": 0.5, **args}),
                             model_config=tiny_model_config())
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    return engine, runner


def test_the_reference_step_runs_a_full_chunk_and_an_eager_batch_above_the_graphs_and_frees_them():
    _, runner = _cpu_runner()
    step = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=100, decode_batch=6, largest_graph_batch=4, mixed_chunk=False)
    assert step.names() == ("prefill_chunk", "eager_decode") and step.prefill_tokens == 100
    free = runner.token_to_kv_pool_allocator.available_size()
    for name in step.names():
        step.run(name)
    assert runner.token_to_kv_pool_allocator.available_size() == free  # the requests were released
    assert runner.req_to_token_pool.available_size() == 6
    only_graphs = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=10**6, decode_batch=6, largest_graph_batch=8,
                                         mixed_chunk=False)
    assert only_graphs.names() == ("prefill_chunk",) and only_graphs.prefill_tokens == 256  # the context length
    with pytest.raises(ValueError, match="no worst-case step 'mixed'"):
        step.run("mixed")


def test_the_steps_sample_with_logprobs_over_the_last_2048_prompt_tokens_and_the_whole_decode_batch(mocker):
    """What the headroom must hold when requests ask for logprobs: the prefill chunk's prompt logprobs (SGLang
    computes them 2,048 tokens at a time) and the decode batch's softmax and log (as vLLM's profile run samples)."""
    import app.forward.worst_case as worst_case

    _, runner = _cpu_runner()
    extend, decode = mocker.spy(runner, "forward_extend"), mocker.spy(runner, "forward_decode")
    sampled = mocker.spy(worst_case, "sample_with_logprobs")
    step = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=100, decode_batch=6, largest_graph_batch=4, mixed_chunk=False)
    for name in step.names():
        step.run(name)
    assert extend.call_args.args[0].logit_rows.tolist() == list(range(100))  # a chunk under 2,048: every token
    assert [tuple(c.args[0].shape) for c in sampled.call_args_list] == [(100, 256), (6, 256)]  # the tiny vocabulary
    assert decode.call_count == 1


def test_a_chunk_above_2048_tokens_takes_prompt_logprobs_over_its_last_2048(mocker):
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "mem_fraction_static": 0.5,
                                                                  "context_length": 2200}),
                             model_config=tiny_model_config(max_position_embeddings=2200))
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    extend = mocker.spy(runner, "forward_extend")
    step = ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=2100, decode_batch=1, largest_graph_batch=4, mixed_chunk=False)
    assert (step.prefill_tokens, step.logprob_tokens) == (2100, 2048)
    step.run("prefill_chunk")
    assert extend.call_args.args[0].logit_rows.tolist() == list(range(2100 - 2048, 2100))


def test_sampling_with_logprobs_writes_probabilities_over_the_logits_and_takes_the_likeliest():
    from app.forward.worst_case import sample_with_logprobs

    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    assert sample_with_logprobs(logits).tolist() == [1, 0]
    assert torch.allclose(logits.sum(-1), torch.ones(2)) and logits[0, 1] > logits[0, 2] > logits[0, 0]


def test_a_family_without_a_reference_forward_is_refused_when_the_step_is_built():
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "mem_fraction_static": 0.5}),
                             model_config=tiny_model_config(model_type="gemma", architectures=["GemmaForCausalLM"]))
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    with pytest.raises(UnsupportedModelError, match="no reference decode for model_type 'gemma'"):
        ReferenceWorstCaseStep(runner=runner, chunked_prefill_size=8, decode_batch=2, largest_graph_batch=0, mixed_chunk=False)


def test_the_worker_container_provides_the_step_and_a_test_swaps_in_the_fake():
    engine, runner = _cpu_runner()
    assert engine.target.worst_case_step.provides is ReferenceWorstCaseStep
    fake = FixedActivationStep.factory({"prefill_chunk": 3 * MiB, "eager_decode": MiB})
    engine2 = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "mem_fraction_static": 0.5}),
                              model_config=tiny_model_config())
    engine2.target.worst_case_step.override(providers.Callable(fake))
    runner2 = engine2.engine().target
    step = runner2._worst_case_step_factory(runner=runner, chunked_prefill_size=64, decode_batch=6,
                                            largest_graph_batch=4, mixed_chunk=True)
    assert step is fake.last and step.built_with["chunked_prefill_size"] == 64
    assert step.built_with["mixed_chunk"] is True
    for name in step.names():
        step.run(name)
    assert step.runs == ["prefill_chunk", "eager_decode"] and step.step_bytes["prefill_chunk"] == 3 * MiB
    with pytest.raises(ValueError, match="no step 'x'"):
        step.run("x")


def test_on_the_cpu_the_switch_changes_nothing():
    _, runner = _cpu_runner(kv_headroom="measured")
    assert runner.start_decode_runtime() is None and runner.measured_sizing is None


# the built plan's max running requests on an H200 at the defaults, and the vocabulary (config.json)
SAMPLED = {"Llama-3.1-8B-Instruct": (3857, 128_256), "Qwen3-8B": (4096, 151_936), "DeepSeek-V2-Lite": (4096, 102_400)}


# what the runs of 2026-12-06 measured (benchmarks/data/h{200,100}_measured_headroom_2026-12-06*.json): the tokens a
# measured bootstrap at the defaults held, and what it kept free beside its pools, the steps sampled with logprobs;
# the H200's DeepSeek-V2-Lite run predates MLA's context step (test_worst_case_steps), the H100's ran it
MEASURED = {("H200", "Llama-3.1-8B-Instruct"): (923_249, 10_260_447_232), ("H200", "Qwen3-8B"): (816_901, 11_850_088_448),
            ("H100-80GB", "Llama-3.1-8B-Instruct"): (466_952, 5_939_331_072),
            ("H100-80GB", "Qwen3-8B"): (377_942, 11_498_881_024),
            ("H100-80GB", "DeepSeek-V2-Lite"): (1_290_152, 10_026_680_320)}


@pytest.mark.parametrize(("card", "model", "flags"), [(*key, ()) for key in sorted(MEASURED)]
                         + [("H100-80GB", "Llama-3.1-8B-Instruct", ("--enable-mixed-chunk",))])
def test_plan_predicts_each_measured_bootstrap_within_half_a_percent_and_never_above(card, model, flags, capsys):
    """The prediction keeps the recorded run's kept_free plus 64 MiB of run-to-run spread, so its tokens are at most
    the run's and within 0.5% of them; it says it is calibrated, and the headline is it. With --enable-mixed-chunk
    the run that measured the mixed step is the one (on the H100 it raised no peak: the same kept_free)."""
    import json

    from app.cli import main
    from kvcache.byte_units import MiB

    assert main(["plan", "--model", model, "--gpu", card, "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    prediction = report["measured_prediction"]
    tokens, kept_free = MEASURED[card, model]
    assert prediction["needed_free_bytes"] == kept_free + 64 * MiB
    assert prediction["needed_free_bytes"] <= prediction["kept_free_bytes"] < prediction["needed_free_bytes"] + 64 * MiB
    assert prediction["basis"] == "calibrated" and "2026-12-06" in prediction["source"]
    assert ("--mixed-chunk" in prediction["source"]) == bool(flags)
    assert tokens * 995 // 1000 <= prediction["tokens"] <= tokens
    assert report["max_total_num_tokens"] == prediction["tokens"]
    assert report["max_total_num_tokens_source"] == "prediction_calibrated"


@pytest.mark.parametrize("model", sorted(set(SAMPLED) - {"DeepSeek-V2-Lite"}))
def test_a_run_recorded_without_the_sampler_gets_its_logprob_bytes_by_formula(model, capsys, monkeypatch):
    """A row recorded before the steps sampled (the H200 runs of 2026-12-04) keeps its kept_free plus, by hand:
    2,048 prompt-logprob tokens x 10 B and each eager decode request x 4 B, per vocabulary entry, and says so."""
    import json

    from app.cli import main
    from kvcache.byte_units import MiB
    from kvcache.sizing import measured_calibration

    unsampled = tuple(c for c in measured_calibration.CALIBRATION if not c.sampled)
    monkeypatch.setattr(measured_calibration, "CALIBRATION", unsampled)
    assert main(["plan", "--model", model, "--gpu", "H200", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prediction, run = report["measured_prediction"], measured_calibration.calibration_for("H200", model)
    assert not run.sampled
    requests, vocab = SAMPLED[model]
    sampler = 2048 * vocab * 10 + requests * vocab * 4
    assert prediction["needed_free_bytes"] == run.kept_free_bytes + 64 * MiB + sampler
    assert prediction["basis"] == "uncalibrated" and f"plus {sampler:,} B for them by formula" in prediction["source"]
    assert report["static_plan_tokens"] <= prediction["tokens"] < run.tokens
    assert report["max_total_num_tokens_source"] == "prediction_uncalibrated"


def test_extrapolation_keeps_more_free_than_each_calibrated_run_and_says_it_is_extrapolated(capsys):
    import json

    from app.cli import main
    from kvcache.models.presets import load_model_config
    from kvcache.sizing.measured_prediction import (

    # the decode batch each run stepped: the built plan's max running requests on that card
        extrapolated_kept_free_bytes, sampler_bytes,
    )
    from kvcache.sizing.measured_calibration import (

    # the decode batch each run stepped: the built plan's max running requests on that card
        CALIBRATION,
    )
    batches = {("H200", "Llama-3.1-8B-Instruct"): 3858, ("H200", "Qwen3-8B"): 4096, ("H200", "DeepSeek-V2-Lite"): 4096,
               ("H100-80GB", "Llama-3.1-8B-Instruct"): 2048, ("H100-80GB", "Qwen3-8B"): 4096,
               ("H100-80GB", "DeepSeek-V2-Lite"): 4096}
    for run in CALIBRATION:
        m, batch = load_model_config(run.model), batches[run.card, run.model]
        kept = extrapolated_kept_free_bytes(hidden=m.hidden_size, vocab=m.vocab_size, layers=m.num_hidden_layers,
                                            moe="n_routed_experts" in m.hf_config, chunk=8192, decode_batch=batch,
                                            graph_bs=256, total_bytes=run.card_total_bytes)
        # a run that sampled with logprobs is compared with the whole formula, one that did not without its sampler
        fitted = kept if run.sampled else kept - sampler_bytes(vocab=m.vocab_size, chunk=8192, decode_batch=batch,
                                                               graph_bs=256)
        # within 20% on the card the coefficients were fitted on; on the H100 the prefill chunk was the larger step
        # and the steps in turn held it alone, where the formula adds 3/5 of it to the decode batch (about 1.5x)
        loose = Fraction(6, 5) if run.card == "H200" else Fraction(8, 5)
        assert run.kept_free_bytes < fitted < run.kept_free_bytes * loose, run
    assert main(["plan", "--model", "Mistral-7B-v0.1", "--gpu", "H100-80GB", "--json"]) == 0  # never measured
    report = json.loads(capsys.readouterr().out)
    assert not report["measured_prediction"]["calibrated"] and report["measured_prediction"]["basis"] == "extrapolated"
    assert report["measured_prediction"]["source"].startswith("from the model's shapes")
    assert report["measured_prediction"]["tokens"] >= report["static_plan_tokens"]  # never below the static plan
    assert report["max_total_num_tokens_source"] == "prediction_extrapolated"


def _llama_cuda_sizing():  # type: ignore[no-untyped-def]
    from kvcache.engines import engine_rules
    from kvcache.inputs.dtypes import KV_CACHE_DTYPES
    from kvcache.inputs.parallel import ParallelState
    from kvcache.inputs.sizing_settings import SizingSettings
    from kvcache.models.presets import load_model_config
    from kvcache.sizing.worker_sizing import WorkerSizing

    return WorkerSizing(settings=SizingSettings(), model_config=load_model_config("Llama-3.1-8B-Instruct"),
                        parallel_state=ParallelState(), model_dtype=BFLOAT16,
                        kv_cache_dtype=KV_CACHE_DTYPES["bfloat16"], device_type="cuda", engine=engine_rules("sglang"))


def test_the_static_floor_is_sglangs_tokens_holding_the_request_table_as_built():
    """The pools are built for the post-capture fraction (3,857 request rows for Llama-3.1-8B on an H200); the
    table is not resized, so the static plan the bootstrap shrinks to keeps SGLang's 892,220 tokens and charges
    those rows: 372 rows of 131,076 int32 more than SGLang's own static plan (3,485 rows), 195,041,280 B beside
    SGLang's 0.903 budget (the tables' slots are rounded to 512 B, the arena to 2 MiB)."""
    from types import SimpleNamespace

    from app.forward.measured_sizing import static_plan
    from kvcache.inputs.parallel import ParallelState
    from kvcache.sizing.worker_memory import WorkerMemory

    sizing = _llama_cuda_sizing()
    memory = WorkerMemory(total_bytes=150_109_880_320, free_before_load=149_458_911_232,
                          free_after_load=133_300_355_072)
    built = sizing.plan(memory)
    static = static_plan(SimpleNamespace(sizing=sizing, parallel_state=ParallelState()), built)
    assert (built.max_running_requests, static.max_running_requests) == (3857, 3857)
    assert static.max_total_num_tokens == 892_220 and static.buffers["req_to_token"] == built.buffers["req_to_token"]
    assert static.buffers["req_to_token"] - 1_827_723_776 == 195_041_280 >= (3857 - 3485) * 131_076 * 4
    grown = static.budget.budget_bytes - 118_802_840_682  # the rows, as the arena's 2 MiB rounding charges them
    assert abs(grown - 195_041_280) < 2 * 2**20 and static.total_bytes <= static.budget.budget_bytes


def test_a_rank_agreeing_down_to_another_ranks_capped_floor_plans_capped_too():
    """On a 36 GiB card the built plan holds full-length requests and the floor caps them (106,032 tokens, each
    request at most 106,031); a rank whose own measurement kept more re-plans to the agreed floor's count, capped
    as the floor is, where it raised BudgetBelowOneRequestError naming a --max-total-tokens nobody gave."""
    from kvcache.inputs.rank_agreement import RankAgreement
    from kvcache.runtime.measured_headroom import agreed_plan
    from kvcache.sizing.static_floor import static_floor
    from kvcache.sizing.worker_memory import WorkerMemory

    sizing = _llama_cuda_sizing()
    memory = WorkerMemory(total_bytes=36 * GiB, free_before_load=36 * GiB, free_after_load=36 * GiB - 16_062_087_168)
    built = sizing.plan(memory)
    floor = static_floor(sizing, built, RankAgreement.alone())
    assert built.request_token_cap is None and floor.request_token_cap == floor.max_total_num_tokens - 1
    agreed = agreed_plan(built, built, floor.max_total_num_tokens)
    assert agreed.max_total_num_tokens == floor.max_total_num_tokens and agreed.request_token_cap is not None


def test_a_floor_running_fewer_requests_than_the_table_holds_still_charges_every_row():
    """On a 23.5 GiB card SGLang's static plan holds 3,875 tokens, so at most 1,937 requests run (two tokens each),
    while the table was built with 2,048 rows of 131,076 int32: the floor keeps the tokens and charges those 2,049
    rows, not 1,938 (58,198,016 B more)."""
    from kvcache.inputs.rank_agreement import RankAgreement
    from kvcache.sizing.static_floor import static_floor
    from kvcache.sizing.worker_memory import WorkerMemory

    total = 47 * GiB // 2
    built = (sizing := _llama_cuda_sizing()).plan(WorkerMemory(total_bytes=total, free_before_load=total,
                                                               free_after_load=total - 16_062_087_168))
    floor = static_floor(sizing, built, RankAgreement.alone())
    assert (built.max_running_requests, floor.max_running_requests, floor.table_requests) == (2048, 1937, 2048)
    assert floor.max_total_num_tokens == 3875 and floor.buffers["req_to_token"] == built.buffers["req_to_token"]
    assert floor.buffers["req_to_token"] - 1_016_101_376 == 58_198_016 >= (2048 - 1937) * 131_076 * 4
    assert floor.total_bytes <= floor.budget.budget_bytes


def test_the_floor_keeps_sglangs_tokens_where_the_arenas_rounding_costs_more_than_the_rows():
    """At 87,701,882,715 B the extra table rows alone left the floor 8 tokens short of SGLang's 427,186 (the arena
    rounds up to 2 MiB): the budget now grows by what the plan charges for the rows, rounding included."""
    import dataclasses

    from kvcache.inputs.rank_agreement import RankAgreement
    from kvcache.sizing.static_floor import static_floor
    from kvcache.sizing.worker_memory import WorkerMemory

    sizing, total = _llama_cuda_sizing(), 87_701_882_715
    memory = WorkerMemory(total_bytes=total, free_before_load=total, free_after_load=total - 16_062_087_168)
    sglang = dataclasses.replace(sizing, settings=sizing.settings.replace(kv_headroom="fraction")).plan(memory)
    floor = static_floor(sizing, sizing.plan(memory), RankAgreement.alone())
    assert floor.max_total_num_tokens == sglang.max_total_num_tokens == 427_186
    assert floor.total_bytes <= floor.budget.budget_bytes
