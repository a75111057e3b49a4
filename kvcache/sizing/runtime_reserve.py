"""The derived mem_fraction_static: the memory a running engine keeps outside weights + KV.

Follows SGLang 0.5.23 (`arg_groups/memory_hook.py`: `handle_gpu_memory_settings`,
`reserve_for_graph_mb`; `cuda_graph_hook.py`: `generate_prefill_cuda_graph_batch_sizes`),
for a CUDA engine that is not disaggregated, with no DeepEP and no post-capture sizing (that one is
`kvcache.sizing.post_capture_eligibility`); a multimodal model's cut comes after, from the engine's rules
(`kvcache.engines.sglang_multimodal`), which may also turn the prefill graphs off. All sizes are in MiB of the card,
as SGLang reads them from nvidia-smi; the arithmetic is exact (Fractions).

    reserve = 512 + 1.5 * max(chunked_prefill, 2048) + tp * pp / 8 * 1024 + graphs
    graphs  = 2 * decode_max_bs                                    (decode CUDA graphs, when captured)
            + 3 * decode_max_bs * dp (+ 1.5 * decode_max_bs * dp above bs 300)  (DP attention: SGLang sets
              decode_max_bs on a GPU whether or not decode graphs are captured, and this term reads it)
            + 8 * len(prefill graph sizes), or 1536 with MLA       (prefill graphs; none with PP > 1; up to
              4,096 tokens for a model whose path names Llama-2, SGLang's own workaround)
    at least 10 GiB on cards above 60 GiB;  fraction = round((card - reserve) / card, 3)

Checked against SGLang 0.5.23's own `handle_gpu_memory_settings` (card size stubbed, the
model lookups stubbed; `tests/test_runtime_reserve.py` holds the numbers): L4 and A10 0.684,
RTX-4090 0.704, A100-40GB 0.823, H100-80GB 0.830, H200 (nvidia-smi's 143,771 MiB) 0.903, B200 0.854;
L4 at TP4 0.658, MLA on the H200 at TP4 0.889, TP8 x attention-DP8 on 80 GiB 0.588; and on every card in
kvcache.inputs.cards for ten setups (tests/test_fraction_vs_sglang.py runs SGLang's code beside this one).
The rule this project used before (from an older SGLang) added 2 GiB (6 GiB for STANDALONE)
for a draft model, had no prefill-graph term and gave 20-35 GiB cards chunked prefill 2048
and batch 24 (L4 0.837); 0.5.23 has none of these.
"""

from __future__ import annotations

from fractions import Fraction

import msgspec

from kvcache.byte_units import MiB
from kvcache.sizing.memory_budget import derive_mem_fraction_static

GiB_IN_MIB = 1024
MLA_PREFILL_GRAPH_RESERVE_MIB = 1536
PREFILL_GRAPH_MIB_PER_SIZE = 8
LLAMA2_PREFILL_GRAPH_MAX_TOKENS = 4096  # SGLang 0.5.23 caps the prefill graphs of a model path naming llama-2


class RuntimeShape(msgspec.Struct, frozen=True, kw_only=True):
    """What the reserve depends on besides the card. None means SGLang's default for the card."""

    cuda_graphs: bool  # False on the CPU and with --disable-cuda-graph
    decode_cuda_graphs: bool = True  # False with --disable-decode-cuda-graph
    decode_graph_cap_set: bool = True  # SGLang sets its decode graph batch cap (False: on the CPU; no graph term at all)
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    tp_size: int = 1
    pp_size: int = 1
    attention_dp_size: int = 1
    uses_mla: bool = False
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    prefill_cuda_graphs: bool = True  # False where the engine captures none for the model (SGLang: some multimodal)
    prefill_graph_max_tokens: int | None = None  # a cap on the largest prefill graph (prefill_graph_token_cap)


def prefill_graph_token_cap(model_path: str) -> int | None:
    """SGLang 0.5.23 captures prefill graphs of at most 4,096 tokens for a model whose path names Llama-2 ("a
    workaround until fixed", memory_hook.py), case-insensitively; no cap for any other."""
    return LLAMA2_PREFILL_GRAPH_MAX_TOKENS if "llama-2" in model_path.lower() else None


def _card_mib(total_bytes: int) -> Fraction:
    return Fraction(total_bytes, MiB)


def default_chunked_prefill_size(total_bytes: int) -> int:
    """SGLang 0.5.23 by card size: 2048 below 20 GiB, 4096 below 60 GiB, 8192 below 160 GiB, else 16384."""
    mib = _card_mib(total_bytes)
    for below_gib, size in ((20, 2048), (60, 4096), (160, 8192)):
        if mib < below_gib * GiB_IN_MIB:
            return size
    return 16384


def default_cuda_graph_max_bs(total_bytes: int, tp_size: int) -> int:
    """SGLang 0.5.23's decode CUDA-graph batch cap by card size (and TP below 4 or not)."""
    mib, small_tp = _card_mib(total_bytes), tp_size < 4
    if mib < 20 * GiB_IN_MIB:
        return 8
    for below_gib, small, large in ((35, 48, 160), (60, 32, 160), (160, 256, 512)):
        if mib < below_gib * GiB_IN_MIB:
            return small if small_tp else large
    return 512


def decode_cuda_graph_max_bs(total_bytes: int, shape: RuntimeShape) -> int:
    """The largest decode batch captured: decode_graph_batch_cap, 0 without decode graphs."""
    if not shape.cuda_graphs or not shape.decode_cuda_graphs:
        return 0
    return decode_graph_batch_cap(total_bytes, shape)


def decode_graph_batch_cap(total_bytes: int, shape: RuntimeShape) -> int:
    """SGLang's decode graph batch cap, set whether or not graphs are captured: the user's value, else the card
    default capped by --max-running-requests; 0 where none is set."""
    if not shape.decode_graph_cap_set:
        return 0
    if shape.cuda_graph_max_bs is not None:
        return shape.cuda_graph_max_bs
    bs = default_cuda_graph_max_bs(total_bytes, shape.tp_size)
    return min(bs, shape.max_running_requests) if shape.max_running_requests is not None else bs


# SGLang 0.5.23's prefill-graph token counts: runs of (first, last, step), then every 512 from 4608 up.
PREFILL_GRAPH_RUNS = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256))
PREFILL_GRAPH_TAIL_START, PREFILL_GRAPH_TAIL_STEP = 4608, 512


def prefill_cuda_graph_count(max_tokens: int) -> int:
    """How many prefill graphs SGLang 0.5.23 captures up to max_tokens (counted, not listed: any size is cheap)."""
    count = sum(max(0, (min(last, max_tokens) - first) // step + 1) for first, last, step in PREFILL_GRAPH_RUNS)
    if max_tokens >= PREFILL_GRAPH_TAIL_START:
        count += (max_tokens - PREFILL_GRAPH_TAIL_START) // PREFILL_GRAPH_TAIL_STEP + 1
    return count


def prefill_graph_reserve_mib(total_bytes: int, shape: RuntimeShape) -> int:
    """Prefill CUDA graphs (SGLang 0.5.23 captures them by default on CUDA, not with PP > 1)."""
    if not shape.cuda_graphs or not shape.prefill_cuda_graphs or shape.pp_size > 1:
        return 0
    if shape.uses_mla:
        return MLA_PREFILL_GRAPH_RESERVE_MIB
    max_tokens = shape.chunked_prefill_size or default_chunked_prefill_size(total_bytes)
    if shape.max_total_tokens is not None:
        max_tokens = min(max_tokens, shape.max_total_tokens)
    if shape.prefill_graph_max_tokens is not None:
        max_tokens = min(max_tokens, shape.prefill_graph_max_tokens)
    return PREFILL_GRAPH_MIB_PER_SIZE * prefill_cuda_graph_count(max_tokens)


def parallel_reserve_mib(tp_size: int, pp_size: int) -> Fraction:
    """SGLang 0.5.23's per-rank communication reserve: tp * pp / 8 GiB, in MiB (exact)."""
    return Fraction(tp_size * pp_size, 8) * GiB_IN_MIB


def runtime_reserve_mib(total_bytes: int, shape: RuntimeShape) -> Fraction:
    """The reserve in MiB (exact), as in the module docstring."""
    chunk = shape.chunked_prefill_size or default_chunked_prefill_size(total_bytes)
    dp = shape.attention_dp_size
    reserve = 512 + Fraction(3, 2) * max(chunk, 2048) + parallel_reserve_mib(shape.tp_size, shape.pp_size)
    reserve += 2 * decode_cuda_graph_max_bs(total_bytes, shape) + prefill_graph_reserve_mib(total_bytes, shape)
    if dp > 1:
        cap = decode_graph_batch_cap(total_bytes, shape)
        reserve += 3 * cap * dp + (Fraction(3, 2) * cap * dp if cap > 300 else 0)
    if _card_mib(total_bytes) > 60 * GiB_IN_MIB:
        reserve = max(reserve, Fraction(10 * GiB_IN_MIB))
    return reserve


def default_mem_fraction_static(total_bytes: int, shape: RuntimeShape) -> float:
    """SGLang 0.5.23's mem_fraction_static for a card of total_bytes (see the module docstring)."""
    return derive_mem_fraction_static(total_bytes, runtime_reserve_mib(total_bytes, shape))
