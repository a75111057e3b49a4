"""What SGLang 0.5.23 charges its KV budget for a draft model's pool, and when that is more than the pool holds.

SGLang sizes the target's tokens from one cell size (srt/model_executor/pool_configurator.py, the pool
configurator's __init__): for EAGLE, EAGLE3 (NEXTN becomes EAGLE) and STANDALONE it adds
int(target cell x draft layers / target layers), "assuming the draft shares the target's per-layer KV size". The
draft worker then builds its pool from the draft's own config (its KV heads and head size) for the same tokens.
An EAGLE or NEXTN draft has the target's attention, so the two agree; a STANDALONE draft is a smaller model with
fewer or narrower heads, and SGLang charges it more than it allocates: Llama-3.1-8B with Llama-3.2-1B is charged
131,072 + 16 x 4,096 = 196,608 B a token and holds 131,072 + 16 x 2,048 = 163,840, so a sixth of the KV budget
stays free. The plan follows SGLang: the same tokens, the pools SGLang builds, the rest kept free and said.
"""

from __future__ import annotations

from kvcache.byte_units import format_bytes
from kvcache.sizing.pool_config import MemoryPoolConfig

SIMPLE_KINDS = frozenset({"full", "mla"})  # one pool a worker: the cell SGLang's proportional rule scales


def sglang_draft_charge(*, target: tuple[int, int], draft: tuple[int, int], kinds: tuple[str, ...]) -> int | None:
    """Bytes a token SGLang charges for the draft's pool where more than it holds: the target's bytes a layer times
    the draft's layers. `target`, `draft`: (KV layers, bytes a token) on this rank; None where the charge is what the
    pool holds, or the pools are not one full-attention / MLA pool each (SGLang sizes those otherwise)."""
    (target_layers, target_bytes), (draft_layers, draft_bytes) = target, draft
    if not set(kinds) <= SIMPLE_KINDS or len(kinds) != 2 or target_layers <= 0 or draft_layers <= 0:
        return None
    charged = target_bytes * draft_layers // target_layers
    return charged if charged > draft_bytes else None


def draft_charge_notes(plan: MemoryPoolConfig, label: str) -> tuple[str, ...]:
    """One line for a draft pool charged more than it holds: the charge, what it holds, the budget left unused."""
    notes = []
    for pool in plan.kv_pools:
        if pool.charged_unheld_bytes:
            notes.append(
                f"{label} charges the draft's pool at the target's KV bytes a layer ({pool.num_layers} layers x "
                f"{pool.charged_bytes_per_token // pool.num_layers:,} = {pool.charged_bytes_per_token:,} B a token) "
                f"but allocates the draft's own ({pool.bytes_per_token:,} B a token): "
                f"{format_bytes(pool.charged_unheld_bytes)} of the KV budget stay unused at these "
                f"{pool.num_tokens:,} tokens")
    return tuple(notes)
