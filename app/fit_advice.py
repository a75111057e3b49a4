"""What `fit` names when no cell serves the target: values that do, each found by planning the cell with it.

Bounded: the running-request cap lifted to the target where it is below it, then TP sizes in powers of two up to
MAX_SUGGESTED_TP on the cards asked and then on every known card (at most log2 of it sizes per card, PP size and
KV dtype); where none serves it, the target cut to what the closest cell planned holds (that cell's own plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.fit_sweep import FitRow, FitSweep
from kvcache.inputs.cards import KNOWN_CARDS, SimulatedCard, card_named

MAX_SUGGESTED_TP = 64  # 8 nodes of 8: past this no serving setup splits one model's heads


@dataclass(slots=True)
class _Search:
    """Cells planned while looking, fewest GPUs first; every row seen is kept for the closest fallback."""

    sweep: FitSweep
    pp_sizes: list[int]
    dtypes: list[str]
    seen: list[FitRow] = field(default_factory=list)

    def first_fitting(self, cards: list[SimulatedCard], tp_sizes: list[int]) -> FitRow | None:
        for _, tp, pp in sorted((tp * pp, tp, pp) for tp in tp_sizes for pp in self.pp_sizes):
            for dtype in self.dtypes:
                for card in cards:
                    row = self.sweep.cell(card, tp, pp, dtype)
                    self.seen.append(row)
                    if row.fits:
                        return row
        return None


def _serves(row: FitRow) -> str:
    return f"{row.gpus} x {row.card}, TP {row.tp_size}, PP {row.pp_size}, KV {row.kv_cache_dtype} serve it"


def fit_fixes(sweep: FitSweep, rows: list[FitRow], cards: list[SimulatedCard], tp_sizes: list[int],
              pp_sizes: list[int], dtypes: list[str]) -> list[str]:
    """Flags and values that serve the target (each planned here), or the target that the closest cell serves."""
    target = sweep.target
    field, cap = sweep.running_cap(rows)
    lift = ""  # a running-request cap below the target is lifted first: no card can help while it stands
    if target.requests is not None and cap is not None and cap < target.requests:
        lift = f"--{field.replace('_', '-')} {target.requests} "
        sweep = type(sweep)(model=sweep.model, settings={**sweep.settings, field: target.requests}, target=target)
    search = _Search(sweep=sweep, pp_sizes=pp_sizes, dtypes=dtypes)
    if lift and (row := search.first_fitting(cards, tp_sizes)) is not None:
        return [f"{lift}({_serves(row)})"]
    larger = [tp for tp in (2**k for k in range(MAX_SUGGESTED_TP.bit_length())) if tp not in tp_sizes]
    if (row := search.first_fitting(cards, larger)) is not None:
        return [f"{lift}--tp-size {row.tp_size} ({_serves(row)})"]
    others = [card_named(name) for name in KNOWN_CARDS if name not in {c.name for c in cards}]
    if (row := search.first_fitting(others, sorted({*tp_sizes, *larger}))) is not None:
        return [f"{lift}--gpu {row.card} --tp-size {row.tp_size} ({_serves(row)})"]
    best = max((r for r in rows + search.seen if r.requests_at_context), key=lambda r: (r.closeness, -r.gpus),
               default=None)
    if best is None:
        return [f"no card of {', '.join(KNOWN_CARDS)} at TP up to {MAX_SUGGESTED_TP} holds the weights and one "
                "request: a shorter --context-length, or a smaller model"]
    where = f"--gpu {best.card} --tp-size {best.tp_size} --pp-size {best.pp_size} --kv-cache-dtype {best.kv_cache_dtype}"
    held = (f"--requests {best.requests_at_context}" if target.requests is not None else
            f"--tokens {best.max_total_tokens}")
    return [f"{lift}{where} {held} (the most {best.gpus} x {best.card} holds)"]
