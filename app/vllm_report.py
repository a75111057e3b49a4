"""The `plan --engine vllm` report: what vLLM 0.34.0 would allocate, as text for people or one JSON object.

A dry run measures the weights (dummy weights on the meta device) and estimates the rest of what vLLM
measures at start-up; the report says which number is estimated (kvcache.engines.vllm_answer).
"""

from __future__ import annotations

import msgspec

from kvcache.engines.vllm_answer import VllmAnswer
from kvcache.byte_units import format_bytes

ESTIMATED_NOTE = ("ESTIMATED: vLLM measures its activation peak, non-torch memory and CUDA graphs at start-up; "
                  "a dry run takes the project's runtime reserve for the card")


class VllmReport(msgspec.Struct, frozen=True, kw_only=True):
    """The answer and what it is for. Keys are stable: scripts read them from --json."""

    model: str
    engine: str  # "vllm"
    engine_version: str  # "0.34.0"
    device: str
    card: str | None
    model_dtype: str
    kv_cache_dtype: str
    estimated: tuple[str, ...]  # the keys of `vllm` a dry run estimates instead of measuring
    vllm: VllmAnswer


def vllm_report(answer: VllmAnswer, *, model: str, device: str, card: str | None, model_dtype: str,
                kv_cache_dtype: str) -> VllmReport:
    return VllmReport(model=model, engine="vllm", engine_version=answer.version, device=device, card=card,
                      model_dtype=model_dtype, kv_cache_dtype=kv_cache_dtype,
                      estimated=("estimated_runtime_bytes",), vllm=answer)


def render_vllm_text(r: VllmReport) -> str:
    a = r.vllm
    groups = ", ".join(
        f"{g.kind}{f' {g.window}' if g.window else ''} x {g.layers} layer{'' if g.layers == 1 else 's'}"
        f"{f' (block {g.block_size})' if g.block_size not in (0, a.block_size) else ''}"
        for g in a.groups)
    lines = [
        f"model               {r.model}",
        f"engine              vllm {r.engine_version}  (whose rules the plan follows: --engine)",
        f"device              {r.device}" + (f"  (plan for {r.card}, nothing allocated)" if r.card else ""),
        f"dtype / KV dtype    {r.model_dtype} / {r.kv_cache_dtype}",
        f"max model len       {a.max_model_len:,}   block size {a.block_size}   max_num_batched_tokens "
        f"{a.max_num_batched_tokens:,}",
        f"memory              total {format_bytes(a.total_bytes)} x gpu_memory_utilization "
        f"{a.gpu_memory_utilization} = {format_bytes(a.requested_bytes)}",
        f"weights             {format_bytes(a.weights_bytes)}",
        f"runtime             {format_bytes(a.estimated_runtime_bytes)}  ({ESTIMATED_NOTE})",
        f"KV available        {format_bytes(a.available_bytes)}",
        f"KV cache groups     {len(a.groups)}: {groups}",
        f"bytes per block     {a.bytes_per_block:,}  (one block id across the largest group)",
        f"num_gpu_blocks      {a.num_gpu_blocks:,}",
        f"blocks a request    {a.blocks_per_request:,}  (at max model len {a.max_model_len:,})",
        f"max concurrency     {a.max_concurrency:.2f}x  (vLLM's KV cache size: {a.kv_cache_tokens:,} tokens)",
    ]
    return "\n".join(lines)


def render_vllm(report: VllmReport, *, as_json: bool) -> str:
    return msgspec.json.encode(report).decode() if as_json else render_vllm_text(report)
