"""What a measured bootstrap (--kv-headroom) will hold, predicted for a dry run: an activation model.

The measured bootstrap keeps free, after its pools: the decode graphs, the worst-case steps'
peak (prefill chunk and eager decode, run in turn), the margin, and what the resize itself
costs (the request table and allocator of the larger plan, whole VMM granules, workspaces).
That sum, `kept_free`, is recorded per card and model at the defaults (CALIBRATION in
kvcache.sizing.measured_calibration, one table of rows: card, model, torch, date, data file; re-fitting from new runs is a change of that data); a dry
run for one of them on that card predicts the same kept_free plus PREDICTION_SAFETY, so it states the
tokens within 0.5% and never above. Anything else (another card, model, or a setting that changes the
steps) is EXTRAPOLATED from the model's shapes with coefficients fitted to those runs, rounded up
(module constants below); the prediction's `basis` says which.

The steps now sample with logprobs (app.forward.worst_case); the recorded runs did not. Until the
H200 is measured again, their kept_free is used with the sampler's bytes added by formula
(`sampler_bytes`, an upper bound: every tensor it adds counted in full), and the prediction says so.
The same holds for the steps no recorded run ran (`added_step_bytes`: the mixed chunk with
--enable-mixed-chunk, MLA's chunked context): their bytes are added by formula, in turn with the
others, and the prediction is not calibrated.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Literal

import msgspec

from kvcache.byte_units import GiB, MiB
from kvcache.errors import DoesNotFitError
from kvcache.sizing.runtime_reserve import decode_cuda_graph_max_bs, default_chunked_prefill_size
from kvcache.sizing.measured_calibration import calibration_for, fitted_on, measured_step
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.sizing.resized_plan import resized_plan_request
from kvcache.sizing.static_floor import static_floor
from kvcache.sizing.worst_case_shapes import mixed_chunk_riders, mla_context_tokens

MEASURED_MARGIN = Fraction(1, 200)  # of the card's total bytes (why: kvcache.runtime.measured_headroom)
MEASURED_MARGIN_FLOOR = 256 * MiB
PREDICTION_SAFETY = 64 * MiB  # run-to-run spread of the recorded kept_free, kept so a prediction is never above


# Extrapolation, fitted to CALIBRATION and rounded up (per unit of hidden size; MoE layers run experts
# densely in graphs and routed eagerly): bytes per prefill token, per eager decode request beyond its
# float32 + bf16 logits (6 B per vocab entry), per captured batch entry per layer; the steps in turn hold
# the decode peak plus this share of the prefill's; the resize's own cost.
PREFILL_PER_TOKEN_PER_HIDDEN = {False: 54, True: 145}
DECODE_PER_REQUEST_PER_HIDDEN = {False: 52, True: 146}
GRAPH_PER_BS_LAYER_PER_HIDDEN = {False: 23, True: 102}
LOGIT_BYTES_PER_VOCAB_ENTRY = 6
# The sampler with logprobs (app.forward.worst_case.sample_with_logprobs): per decode request, a float32 temporary
# over the float32 logits (the softmax's output, then the log's); per prompt-logprob token, the bf16 and float32
# logits and that temporary (counted as if the bf16 block stayed cached beside them: an upper bound).
SAMPLER_BYTES_PER_VOCAB_ENTRY = 4
PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY = 10
PROMPT_LOGPROB_TOKENS = 2048  # SGLang 0.5.23 computes input logprobs this many tokens at a time (its default)
ALTERNATING_PREFILL_SHARE = Fraction(3, 5)
RESIZE_OVERHEAD_BYTES = GiB


def measured_margin_bytes(total_bytes: int) -> int:
    """The margin kept free beyond the measured peak (see kvcache.runtime.measured_headroom)."""
    return max(int(total_bytes * MEASURED_MARGIN), MEASURED_MARGIN_FLOOR)


Basis = Literal["calibrated", "uncalibrated", "extrapolated"]


class MeasuredPrediction(msgspec.Struct, frozen=True, kw_only=True):
    """The tokens a measured bootstrap will hold and the bytes those tokens leave free, what its steps are
    predicted to need free, and how the prediction was made: `calibrated` (a recorded run of this model on this
    card at these settings), `uncalibrated` (such a run, with bytes it did not measure added by formula) or
    `extrapolated` (from the model's shapes)."""

    tokens: int
    kept_free_bytes: int  # free after load - the predicted plan's bytes: the headroom of `tokens`
    needed_free_bytes: int  # what the graphs, the worst-case steps, the margin and the resize are predicted to need
    static_tokens: int  # the floor: SGLang's static plan as the built pools hold it
    basis: Basis
    source: str
    kv_headroom: str = "auto"  # the switch that measures: auto, or measured given

    @property
    def calibrated(self) -> bool:
        return self.basis == "calibrated"

    @property
    def at_static_floor(self) -> str:
        """Why the measured path would not move the static plan, in one clause ("" when it moves it)."""
        if self.tokens > self.static_tokens:
            return ""
        if self.needed_free_bytes <= self.kept_free_bytes:
            return "the measured path keeps the static plan: the pools are built for no more tokens"
        return (f"the measured path keeps the static plan: its steps are predicted to need "
                f"{self.needed_free_bytes / GiB:.2f} GiB free, more than the {self.kept_free_bytes / GiB:.2f} GiB "
                "the static plan leaves, and it plans below that plan only where it measures an out-of-memory")

    def to_dict(self) -> dict[str, object]:
        return {"tokens": self.tokens, "kept_free_bytes": self.kept_free_bytes,
                "needed_free_bytes": self.needed_free_bytes, "static_tokens": self.static_tokens,
                "calibrated": self.calibrated, "basis": self.basis, "at_static_floor": self.at_static_floor,
                "source": self.source, "kv_headroom": self.kv_headroom}


def sampler_bytes(*, vocab: int, chunk: int, decode_batch: int, graph_bs: int) -> int:  # graph_bs: graph-served
    """What sampling with logprobs adds to the steps without it (bytes): the prefill chunk's prompt logprobs, and
    the eager decode batch's softmax and log when there is one; counted in full, as if both stayed cached."""
    prompt = min(chunk, PROMPT_LOGPROB_TOKENS) * PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY * vocab
    decode = decode_batch * SAMPLER_BYTES_PER_VOCAB_ENTRY * vocab if decode_batch > graph_bs else 0
    return prompt + decode


def with_step_in_turn(peak: int, step: int) -> int:
    """The steps' peak once a step of `step` bytes runs in turn with steps peaking at `peak`: the larger, plus
    ALTERNATING_PREFILL_SHARE of the smaller (one step's blocks stay cached while the other's sizes cannot reuse
    them; the share is the one fitted to the prefill chunk and the eager decode)."""
    return max(peak, step) + int(min(peak, step) * ALTERNATING_PREFILL_SHARE)


def added_step_bytes(*, sizing: object, static: MemoryPoolConfig, chunk: int, decode_batch: int) -> dict[str, int]:
    """The steps no recorded run ran, by formula (bytes, by step name; app.forward.worst_case runs them), every
    tensor counted in full as if all stayed cached (an upper bound until measured): the mixed chunk (its chunk's
    activations and every rider's logits and probabilities) and MLA's chunked context (the context and the chunk
    up-projected as the reference prefills: the latents gathered, the keys' no-RoPE part, the keys, the values
    and the values padded to the keys' head size, in the model's dtype; beside the chunk's activations and its
    prompt logprobs)."""
    s, m = sizing.settings, sizing.model_config  # type: ignore[attr-defined]
    hf, moe = m.hf_config, _is_moe(m.hf_config)
    pool_tokens = static.max_total_num_tokens - static.page_size
    tokens = min(chunk, static.context_length, pool_tokens)
    activations = tokens * PREFILL_PER_TOKEN_PER_HIDDEN[moe] * m.hidden_size
    steps: dict[str, int] = {}
    riders = mixed_chunk_riders(prefill_tokens=tokens, decode_batch=decode_batch, pool_tokens=pool_tokens,
                                page_size=static.page_size) if s.enable_mixed_chunk else 0
    if riders:
        rows = riders + 1
        steps["mixed_chunk"] = activations + rows * (LOGIT_BYTES_PER_VOCAB_ENTRY + SAMPLER_BYTES_PER_VOCAB_ENTRY) * m.vocab_size
    context = mla_context_tokens(prefill_tokens=tokens, context_length=static.context_length,
                                 pool_tokens=pool_tokens) if "kv_lora_rank" in hf else 0
    if context:
        nope, rope, v_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"]), int(hf["v_head_dim"])
        heads = int(hf["num_attention_heads"]) // sizing.parallel_state.tp_size  # type: ignore[attr-defined]
        per_head = nope + 2 * (nope + rope) + v_dim + (nope + rope if v_dim < nope + rope else 0)
        per_token = sizing.model_dtype.itemsize * (int(hf["kv_lora_rank"]) + rope + heads * per_head)  # type: ignore[attr-defined]
        prompt = min(tokens, PROMPT_LOGPROB_TOKENS) * PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY * m.vocab_size
        steps["mla_context"] = (context + tokens) * per_token + activations + prompt
    return steps


def with_measured_steps(model: str, added: dict[str, int]) -> tuple[dict[str, int], dict[str, str]]:
    """`added` (added_step_bytes) with each step a recorded run of this model measured in the same tensors (on
    another card: kvcache.sizing.measured_calibration.measured_step) at its measured peak; and the card of each."""
    borrowed: dict[str, str] = {}
    out = dict(added)
    for name, counted in added.items():
        found = measured_step(model, name, counted)
        if found is not None:
            out[name], borrowed[name] = found
    return out, borrowed


def steps_note(added: dict[str, int], borrowed: dict[str, str], what: str) -> str:
    """How the steps no recorded run of this card ran are counted: by formula, or measured on another card."""
    if not borrowed:
        return f"by formula {what} ({', '.join(added)})"
    how = (f"{n}: measured on {borrowed[n]}, the same tensors" if n in borrowed else f"{n}: by formula" for n in added)
    return f"{what} on this card ({'; '.join(how)})"


def _is_moe(hf: dict[str, object]) -> bool:
    return any(k in hf for k in ("n_routed_experts", "num_experts", "num_local_experts"))


def extrapolated_kept_free_bytes(*, hidden: int, vocab: int, layers: int, moe: bool, chunk: int, decode_batch: int,
                                 graph_bs: int, total_bytes: int, graph_served_bs: int | None = None,
                                 added_steps: tuple[int, ...] = ()) -> int:
    """kept_free from the model's shapes (the fitted coefficients above, plus the sampler's bytes); decode batches
    above `graph_served_bs` (the largest graph, `graph_bs`, unless padding is off) run eagerly; `added_steps`
    (bytes each, added_step_bytes) run in turn with the others."""
    served = graph_bs if graph_served_bs is None else graph_served_bs
    prefill = chunk * PREFILL_PER_TOKEN_PER_HIDDEN[moe] * hidden
    decode = decode_batch * (LOGIT_BYTES_PER_VOCAB_ENTRY * vocab + DECODE_PER_REQUEST_PER_HIDDEN[moe] * hidden)
    eager = decode_batch > served
    # the steps in turn hold the decode peak and a share of the prefill's, and never less than the prefill alone
    peak = max(prefill, decode + int(prefill * ALTERNATING_PREFILL_SHARE)) if eager else prefill
    peak += sampler_bytes(vocab=vocab, chunk=chunk, decode_batch=decode_batch, graph_bs=served)
    for step in added_steps:
        peak = with_step_in_turn(peak, step)
    graphs = graph_bs * layers * GRAPH_PER_BS_LAYER_PER_HIDDEN[moe] * hidden
    return graphs + peak + measured_margin_bytes(total_bytes) + RESIZE_OVERHEAD_BYTES


def predict_measured_tokens(*, sizing: object, memory: object, card_name: str | None) -> MeasuredPrediction | None:
    """What a measured bootstrap of this worker on a CUDA card of `memory` will hold (None where it would not
    measure)."""
    predicted = predict_measured_plan(sizing=sizing, memory=memory, card_name=card_name)
    return predicted[0] if predicted is not None else None


def predict_measured_plan(*, sizing: object, memory: object,
                          card_name: str | None) -> tuple[MeasuredPrediction, MemoryPoolConfig] | None:
    """The measured bootstrap's plan for this worker on a CUDA card of `memory` (None where it would not measure):
    the built plan re-planned to leave kept_free free, at least the static plan, at most the built one."""
    cuda = dataclasses.replace(sizing, device_type="cuda")  # type: ignore[type-var]
    if not cuda.post_capture_resize().measured:
        return None
    built = cuda.plan(memory)
    static = static_floor(cuda, built, RankAgreement.alone())  # the bootstrap's floor, for this one worker
    s, m = cuda.settings, cuda.model_config
    defaults = all(v is None for v in (s.chunked_prefill_size, s.cuda_graph_max_bs, s.max_running_requests,
                                       s.max_total_tokens, s.context_length)) and not any(
        (s.disable_cuda_graph_padding, s.disable_cuda_graph, s.disable_decode_cuda_graph, s.disable_prefill_cuda_graph))
    calibration = calibration_for(card_name, m.name, mixed_chunk=s.enable_mixed_chunk)
    single = cuda.parallel_state.tp_size * cuda.parallel_state.pp_size == 1
    total = memory.total_bytes  # type: ignore[attr-defined]
    card = memory.device_capacity_bytes  # type: ignore[attr-defined]  # SGLang's card-size defaults read nvidia-smi's
    shape = cuda.runtime_shape()
    basis: Basis
    chunk = s.chunked_prefill_size or default_chunked_prefill_size(card)
    added, borrowed = with_measured_steps(
        m.name, added_step_bytes(sizing=cuda, static=static, chunk=chunk, decode_batch=built.max_running_requests))
    if calibration is not None and defaults and single and s.page_size == 1 and cuda.kv_cache_dtype.bits == 16:
        where = f"{calibration.card} ({calibration.source})"
        kept, basis, source = calibration.kept_free_bytes + PREDICTION_SAFETY, "calibrated", "a recorded run on " + where
        peak = calibration.alternating_bytes
        if not calibration.sampled:
            extra = sampler_bytes(vocab=m.vocab_size, chunk=chunk, decode_batch=built.max_running_requests,
                                  graph_bs=decode_cuda_graph_max_bs(card, shape))
            kept, basis, peak = kept + extra, "uncalibrated", peak + extra
            source = (f"a recorded run without the sampler's logprobs, plus {extra:,} B for them by formula (an upper "
                      f"bound until re-measured): {where}")
        added = {name: bytes_ for name, bytes_ in added.items() if name not in calibration.steps_run}
        if added:
            in_turn = peak
            for step in added.values():
                in_turn = with_step_in_turn(in_turn, step)
            kept, basis = kept + in_turn - peak, "uncalibrated"
            source += f"; plus {in_turn - peak:,} B {steps_note(added, borrowed, 'for the steps no recorded run ran')}"
    else:
        kept = extrapolated_kept_free_bytes(
            hidden=m.hidden_size, vocab=m.vocab_size, layers=m.num_hidden_layers, moe=_is_moe(m.hf_config),
            chunk=chunk, decode_batch=built.max_running_requests,
            graph_bs=decode_cuda_graph_max_bs(card, shape), total_bytes=total,
            graph_served_bs=s.graph_served_batch(decode_cuda_graph_max_bs(card, shape)),
            added_steps=tuple(added.values()))
        basis, source = "extrapolated", "from the model's shapes, coefficients fitted on " + fitted_on()
        if added:
            source += f"; {steps_note(added, borrowed, 'with the steps no recorded run ran')}"
    free = memory.free_after_load  # type: ignore[attr-defined]
    plan = _plan_leaving(built, static, free - kept)
    return MeasuredPrediction(tokens=plan.max_total_num_tokens, kept_free_bytes=free - plan.total_bytes,
                              needed_free_bytes=kept, static_tokens=static.max_total_num_tokens, basis=basis,
                              source=source, kv_headroom=s.kv_headroom), plan


def _plan_leaving(built: MemoryPoolConfig, static: MemoryPoolConfig, budget: int) -> MemoryPoolConfig:
    """`built` re-planned for `budget`, never below the static floor (the measured bootstrap's own bounds)."""
    try:
        after = plan_pool_sizes(resized_plan_request(built, max(budget, 0)))
    except DoesNotFitError:
        return static
    return after if after.max_total_num_tokens >= static.max_total_num_tokens else static
