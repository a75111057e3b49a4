"""The recorded runs a dry run's prediction of measured headroom is calibrated from (card, model, torch, date: data
in the project), and which of them the extrapolation was fitted on."""

from __future__ import annotations

import msgspec


class Calibration(msgspec.Struct, frozen=True, kw_only=True):
    """One measured bootstrap at the defaults on one card (bytes): what it kept free beside its pools, and the
    parts; where it was run. A row of CALIBRATION: re-fitting from new runs changes that table, not code."""

    card: str  # a name of kvcache.inputs.cards (the card `plan --gpu` names)
    card_total_bytes: int  # cudaMemGetInfo's total on that card
    model: str  # the preset's name
    source: str  # torch, date, the benchmark and its data file
    graph_bytes: int
    prefill_chunk_bytes: int
    eager_decode_bytes: int
    alternating_bytes: int
    kept_free_bytes: int  # free after load - the measured plan's bytes
    tokens: int
    sampled: bool = False  # whether the steps ran the sampler with logprobs (sample_with_logprobs)
    steps_run: tuple[str, ...] = ("prefill_chunk", "eager_decode")  # the worst-case steps that run measured
    # the steps beyond those two, each (name, its measured peak, what added_step_bytes counts for it on that card)
    measured_steps: tuple[tuple[str, int, int], ...] = ()


_H200_2026_12_04 = ("torch 2.11.0+cu130, 2026-12-04, benchmarks/gpu_measured_headroom.py "
                    "(benchmarks/data/h200_measured_headroom_2026-12-04.json)")


_H200_2026_12_06 = ("torch 2.11.0+cu130, 2026-12-06, benchmarks/gpu_measured_headroom.py, the steps sampled with "
                    "logprobs (benchmarks/data/h200_measured_headroom_2026-12-06.json)")


_H100_2026_12_06 = ("torch 2.11.0+cu130, 2026-12-06, benchmarks/gpu_measured_headroom.py, the steps sampled with "
                    "logprobs (benchmarks/data/h100_measured_headroom_2026-12-06.json)")


_H100_2026_12_06_B = ("torch 2.11.0+cu130, 2026-12-06 05:11 UTC, benchmarks/gpu_measured_headroom.py, the steps "
                      "sampled with logprobs (benchmarks/data/h100_measured_headroom_2026-12-06b.json)")


_H100_2026_12_06_MIXED = ("torch 2.11.0+cu130, 2026-12-06 05:16 UTC, benchmarks/gpu_measured_headroom.py "
                          "--mixed-chunk, the steps sampled with logprobs "
                          "(benchmarks/data/h100_measured_headroom_mixed_2026-12-06.json)")


# Every recorded run the prediction is calibrated on, one row each (card, model, whether the mixed step ran; the
# newest row of a pair is the one used); the extrapolation's coefficients below were fitted to the 2026-12-04 rows
# (the steps without the sampler), whose sampler bytes the 2026-12-06 rows measured: 10.0 B per prompt-logprob vocab
# entry, as counted.
CALIBRATION: tuple[Calibration, ...] = (
    Calibration(card="H200", card_total_bytes=150_109_880_320, model="Llama-3.1-8B-Instruct", source=_H200_2026_12_04,
                graph_bytes=725_614_592, prefill_chunk_bytes=1_577_058_304, eager_decode_bytes=3_630_170_112,
                alternating_bytes=4_548_722_688, kept_free_bytes=6_875_643_904, tokens=949_067),
    Calibration(card="H200", card_total_bytes=150_109_880_320, model="Qwen3-8B", source=_H200_2026_12_04,
                graph_bytes=805_306_368, prefill_chunk_bytes=1_746_927_616, eager_decode_bytes=4_575_985_664,
                alternating_bytes=5_481_955_328, kept_free_bytes=7_624_327_168, tokens=845_553),
    Calibration(card="H200", card_total_bytes=150_109_880_320, model="DeepSeek-V2-Lite", source=_H200_2026_12_04,
                graph_bytes=1_426_063_360, prefill_chunk_bytes=2_373_976_064, eager_decode_bytes=3_726_639_104,
                alternating_bytes=4_894_752_768, kept_free_bytes=7_586_578_432, tokens=3_459_106),
    Calibration(card="H200", card_total_bytes=150_109_880_320, model="Llama-3.1-8B-Instruct", source=_H200_2026_12_06,
                graph_bytes=725_614_592, prefill_chunk_bytes=4_204_789_760, eager_decode_bytes=5_674_893_312,
                alternating_bytes=8_166_309_888, kept_free_bytes=10_260_447_232, tokens=923_249, sampled=True),
    Calibration(card="H200", card_total_bytes=150_109_880_320, model="Qwen3-8B", source=_H200_2026_12_06,
                graph_bytes=805_306_368, prefill_chunk_bytes=4_659_871_744, eager_decode_bytes=6_931_087_360,
                alternating_bytes=9_638_510_592, kept_free_bytes=11_850_088_448, tokens=816_901, sampled=True),
    # run before the MLA chunked-context step existed: that step is added by formula (uncalibrated) until re-run
    Calibration(card="H200", card_total_bytes=150_109_880_320, model="DeepSeek-V2-Lite", source=_H200_2026_12_06,
                graph_bytes=1_426_063_360, prefill_chunk_bytes=4_458_545_152, eager_decode_bytes=5_404_360_704,
                alternating_bytes=7_818_182_656, kept_free_bytes=10_495_328_256, tokens=3_365_683, sampled=True),
    Calibration(card="H100-80GB", card_total_bytes=85_017_493_504, model="Llama-3.1-8B-Instruct", source=_H100_2026_12_06,
                graph_bytes=725_614_592, prefill_chunk_bytes=4_204_789_760, eager_decode_bytes=2_940_207_104,
                alternating_bytes=4_206_886_912, kept_free_bytes=5_939_331_072, tokens=466_952, sampled=True),
    Calibration(card="H100-80GB", card_total_bytes=85_017_493_504, model="Qwen3-8B", source=_H100_2026_12_06_B,
                graph_bytes=803_209_216, prefill_chunk_bytes=4_659_871_744, eager_decode_bytes=6_931_087_360,
                alternating_bytes=9_638_510_592, kept_free_bytes=11_498_881_024, tokens=377_942, sampled=True),
    # the MLA chunked-context step (2,787,115,008 B) ran in turn with the others and raised no peak
    Calibration(card="H100-80GB", card_total_bytes=85_017_493_504, model="DeepSeek-V2-Lite", source=_H100_2026_12_06_B,
                graph_bytes=1_426_063_360, prefill_chunk_bytes=4_458_545_152, eager_decode_bytes=5_337_251_840,
                alternating_bytes=7_818_182_656, kept_free_bytes=10_026_680_320, tokens=1_290_152, sampled=True,
                steps_run=("prefill_chunk", "eager_decode", "mla_context"),
                measured_steps=(("mla_context", 2_787_115_008, 8_398_045_184),)),
    # --enable-mixed-chunk: the mixed step (4,204,789,760 B, the prefill chunk's own peak) raised no peak either
    Calibration(card="H100-80GB", card_total_bytes=85_017_493_504, model="Llama-3.1-8B-Instruct",
                source=_H100_2026_12_06_MIXED, graph_bytes=725_614_592, prefill_chunk_bytes=4_204_789_760,
                eager_decode_bytes=2_940_207_104, alternating_bytes=4_206_886_912, kept_free_bytes=5_939_331_072,
                tokens=466_952, sampled=True, steps_run=("prefill_chunk", "eager_decode", "mixed_chunk"),
                measured_steps=(("mixed_chunk", 4_204_789_760, 4_438_622_208),)),
)


def calibration_for(card: str | None, model: str, *, mixed_chunk: bool = False) -> Calibration | None:
    """The recorded run for this card and model (the newest where several are), or None: one that ran the mixed
    step exactly when `mixed_chunk` asks for it, where there is one (a run without it gets the step by formula; a
    run with it covers a start without it, holding more)."""
    rows = [c for c in CALIBRATION if c.card == card and c.model == model]
    alike = [c for c in rows if ("mixed_chunk" in c.steps_run) == mixed_chunk]
    return (alike or rows)[-1] if rows else None


def fitted_on() -> str:
    """Which runs the extrapolation's coefficients come from (the rows without the sampler, which they model by
    formula): each card once, with its runs' source."""
    cards = dict.fromkeys(f"{c.card} ({c.source})" for c in CALIBRATION if not c.sampled)
    return "; ".join(cards)


def measured_step(model: str, step: str, formula_bytes: int) -> tuple[int, str] | None:
    """A step a recorded run of `model` measured where the formula counts it as it counts this one (`formula_bytes`:
    the same chunk, context and shapes, so the same tensors): its measured peak and the card it ran on, or None."""
    for run in reversed(CALIBRATION):
        for name, measured, counted in run.measured_steps:
            if run.model == model and name == step and counted == formula_bytes:
                return measured, run.card
    return None
