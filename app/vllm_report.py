"""The `plan --engine vllm` report: what vLLM 0.34.0 would allocate, as text for people or one JSON object.

A dry run counts the weights (app.dry_run) and estimates the rest of what vLLM
measures at start-up; the report says which number is estimated (kvcache.engines.vllm_answer).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from app.dry_run import PlannedWorker
from app.plan_wiring import planned_workers
from app.report_header import report_header
from kvcache.byte_units import format_bytes
from kvcache.engines import engine_rules, vllm_rules
from kvcache.engines.vllm_answer import VllmAnswer, vllm_answer
from kvcache.inputs.cards import SimulatedCard
from kvcache.inputs.dtypes import DType, KVCacheDtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.sizing.runtime_reserve import RuntimeShape
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.worker_sizing import WorkerSizing

ESTIMATED_NOTE = ("ESTIMATED: vLLM measures its activation peak, non-torch memory and CUDA graphs at start-up; "
                  "a dry run takes the project's runtime reserve for the card")


class VllmReport(msgspec.Struct, frozen=True, kw_only=True):
    """The answer and what it is for. Keys are stable: scripts read them from --json. The top-level keys every
    plan has (app.report.BootstrapReport's: tokens, bytes per token, budget, ...) carry vLLM's numbers, so a
    script reads either engine's plan alike; `vllm` holds the whole answer."""

    model: str
    engine: str  # "vllm"
    engine_version: str  # "0.34.0"
    device: str
    card: str | None
    model_dtype: str
    kv_cache_dtype: str
    page_size: int  # vLLM's attention block size
    context_length: int  # max_model_len
    bytes_per_token: int  # in the groups that hold every token (full attention, MLA)
    max_total_num_tokens: int  # vLLM's "GPU KV cache size" in tokens
    max_running_requests: int  # max_num_seqs
    budget_bytes: int  # vLLM's available KV cache memory
    total_memory_bytes: int
    weights_bytes: int
    estimated: tuple[str, ...]  # the keys of `vllm` a dry run estimates instead of measuring
    vllm: VllmAnswer
    engine_notes: tuple[str, ...] = ()  # what vLLM does otherwise for this model (an architecture it has no class for)


def vllm_report(answer: VllmAnswer, *, model: str, device: str, card: str | None, model_dtype: str,
                kv_cache_dtype: str, engine_notes: tuple[str, ...] = ()) -> VllmReport:
    return VllmReport(model=model, engine="vllm", engine_version=answer.version, device=device, card=card,
                      model_dtype=model_dtype, kv_cache_dtype=kv_cache_dtype, page_size=answer.block_size,
                      context_length=answer.max_model_len, bytes_per_token=answer.bytes_per_token,
                      max_total_num_tokens=answer.kv_cache_tokens, max_running_requests=answer.max_num_seqs,
                      budget_bytes=answer.available_bytes, total_memory_bytes=answer.total_bytes,
                      weights_bytes=answer.weights_bytes, estimated=("estimated_runtime_bytes",),
                      vllm=answer, engine_notes=engine_notes)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmCase:
    """What vLLM's answer reads from one wiring, the card and the weights aside (a `fit` sweep reuses it per card)."""

    args: ServerArgs
    model: ModelConfig
    parallel: ParallelState
    kv_dtype: KVCacheDtype
    model_dtype: DType
    max_model_len: int
    runtime: RuntimeShape  # what the estimate of vLLM's start-up measurements is sized for


def vllm_case(args: ServerArgs, model: ModelConfig, sizing: WorkerSizing) -> VllmCase:
    """The flags, model and the target's rank and formats (its WorkerSizing) as vLLM reads them (its max_model_len
    checked)."""
    max_model_len = vllm_rules.max_model_len(model.name, model.max_position_embeddings, args.max_model_len,
                                             allow_long=args.allow_long_context)
    vllm_rules.check_sparse_mla_spelling(args.kv_cache_dtype, bool(model.index_head_dim))
    runtime = sizing.runtime_shape()  # its prefill chunk becomes vLLM's step in vllm_answer
    return VllmCase(args=args, model=model, parallel=sizing.parallel_state, kv_dtype=sizing.kv_cache_dtype,
                    model_dtype=sizing.model_dtype, max_model_len=max_model_len, runtime=runtime)


def answer_on_card(case: VllmCase, *, total_bytes: int, weights_bytes: int, card: str | None) -> VllmAnswer:
    """vLLM's answer for this case on a card of `total_bytes` (named `card`, which vLLM's batch defaults read)
    holding `weights_bytes` of weights."""
    a = case.args
    return vllm_answer(
        case.model, case.parallel, case.kv_dtype, model_dtype=case.model_dtype, total_bytes=total_bytes,
        weights_bytes=weights_bytes, runtime=case.runtime, max_model_len=case.max_model_len,
        gpu_memory_utilization=a.gpu_memory_utilization, block_size=a.block_size, max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=a.enable_prefix_caching,
        device_name=card or "",
    )


def plan_for_vllm(server_args: ServerArgs, model: ModelConfig, parallel_state: ParallelState,
                  card: SimulatedCard) -> VllmReport:
    """The target's weights on `card` (counted, and refused as a start refuses them: app.dry_run) and vLLM's
    rules for the rest; no pools are planned."""
    wired = planned_workers(server_args, model, parallel_state)
    case = vllm_case(server_args, model, wired.sizing)
    rules = engine_rules(server_args.engine)
    target = PlannedWorker(wired=wired.workers[0], parallel_state=parallel_state,
                           memory_probe=FixedMemoryProbe.of_card(card))
    weights = target.load_weights()
    answer = answer_on_card(case, total_bytes=target.memory_probe.total_bytes(), weights_bytes=weights.total_bytes,
                            card=card.name)
    return vllm_report(answer, model=case.model.name, device=str(target.device), card=card.name,
                       model_dtype=case.model_dtype.name, kv_cache_dtype=case.kv_dtype.name,
                       engine_notes=(*rules.config_notes(case.model), *rules.kv_dtype_notes(
                           case.model, kv_cache_dtype=case.kv_dtype.name, model_dtype=case.model_dtype.name)))


def render_vllm_text(r: VllmReport) -> str:
    a = r.vllm
    kinds: dict[tuple[str, int, int], list[int]] = {}
    for g in a.groups:
        kinds.setdefault((g.kind, g.window, g.block_size), []).append(g.layers)
    groups = "; ".join(
        f"{len(layers)} x {kind}{f' {window}' if window else ''} ({', '.join(map(str, layers))} layers"
        f"{f', block {block}' if block not in (0, a.block_size) else ''})"
        for (kind, window, block), layers in kinds.items())
    lines = [
        *report_header(model=r.model, engine="vllm", engine_version=r.engine_version, device=r.device,
                       card=r.card, model_dtype=r.model_dtype, kv_cache_dtype=r.kv_cache_dtype),
        f"max model len       {a.max_model_len:,}   block size {a.block_size}   max_num_seqs {a.max_num_seqs:,}   "
        f"max_num_batched_tokens {a.max_num_batched_tokens:,}",
        f"prefix caching      {'on' if a.enable_prefix_caching else 'off'}"
        f"{f'  (mamba_cache_mode {a.mamba_cache_mode})' if any(g.kind == 'mamba' for g in a.groups) else ''}",
        f"memory              total {format_bytes(a.total_bytes)} x gpu_memory_utilization "
        f"{a.gpu_memory_utilization} = {format_bytes(a.requested_bytes)}",
        f"weights             {format_bytes(a.weights_bytes)}",
        f"runtime             {format_bytes(a.estimated_runtime_bytes)}  ({ESTIMATED_NOTE})",
        f"KV available        {format_bytes(a.available_bytes)}",
        f"KV cache groups     {len(a.groups)}: {groups}",
        *(_state_only_lines(a) if all(g.kind == "mamba" for g in a.groups) else [
            f"bytes per block     {a.bytes_per_block:,}  (one block id across the largest group)",
            f"num_gpu_blocks      {a.num_gpu_blocks:,}",
            f"blocks a request    {a.blocks_per_request:,}  (at max model len {a.max_model_len:,})",
            f"max concurrency     {a.max_concurrency:.2f}x  (vLLM's KV cache size: {a.kv_cache_tokens:,} tokens)"]),
        *(f"note: {n}" for n in r.engine_notes),
    ]
    return "\n".join(lines)


def _state_only_lines(a: VllmAnswer) -> list[str]:
    """A model without attention (every group Mamba): its state blocks a request, whatever its length (one; three in
    mamba_cache_mode "align"); vLLM's token figure is requests x max_model_len, not tokens of KV."""
    blocks = a.blocks_per_request
    return [f"state per request   {format_bytes(a.bytes_per_block * blocks)}  ({blocks} state block"
            f"{'' if blocks == 1 else 's'} of {a.bytes_per_block:,} B, every layer, mamba_cache_mode "
            f"{a.mamba_cache_mode}: no per-token KV)",
            f"num_gpu_blocks      {a.num_gpu_blocks:,}  (state blocks)",
            f"max concurrency     {a.max_concurrency:.2f}x  requests, each of any length up to max model len "
            f"(vLLM logs {a.kv_cache_tokens:,} tokens: requests x max_model_len)"]


def render_vllm(report: VllmReport, *, as_json: bool) -> str:
    return msgspec.json.encode(report).decode() if as_json else render_vllm_text(report)
