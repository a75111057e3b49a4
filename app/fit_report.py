"""What `fit` prints: a table a person reads at a glance, or one JSON object with a stable schema.

The table lists the cells that fit (cheapest marked `*`) and the few that came closest to it; the
others are counted in one line unless `--all` lists them. JSON always carries every row.
"""

from __future__ import annotations

import msgspec

from app.failures import Failure
from app.fit_sweep import FitRow, FitTarget
from kvcache.byte_units import GiB

FIT_SCHEMA = "kvcache-fit/2"  # bump when a key changes meaning or goes away (2: max_total_tokens is the headline)
TOKENS_BY = {"static_plan": "static plan", "prediction_calibrated": "measured", "prediction_uncalibrated": "uncalibrated",
             "prediction_extrapolated": "extrapolated", "vllm_answer": "vLLM 0.34"}  # where `max tokens` comes from
CLOSEST_SHOWN = 5  # rows that miss the target, shown beside those that meet it (all of them with --all)


class FitSpace(msgspec.Struct, frozen=True, kw_only=True):
    """What was swept."""

    cards: list[str]
    tp_sizes: list[int]
    pp_sizes: list[int]
    kv_cache_dtypes: list[str]


class FitResult(msgspec.Struct, frozen=True, kw_only=True):
    """The sweep's outcome as scripts read it from `fit --json`."""

    schema: str
    model: str
    target: FitTarget
    context_length: int  # what every cell planned with (--context-length, else the model's)
    space: FitSpace
    rows: list[FitRow]  # in the table's order
    cheapest: FitRow | None  # the first row that fits (fewest GPUs, then the least headroom)
    closest: FitRow | None  # when nothing fits: the row that came nearest
    error: Failure | None = None  # when nothing fits (exit 3)

    def json(self) -> str:
        return msgspec.json.encode(self).decode()


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.1f}"


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _tokens_by(row: FitRow) -> str:
    """Where a row's `max tokens` comes from; a prediction that keeps the static plan says so ("static, kept")."""
    if row.tokens_source is None:
        return "-"
    if row.tokens_source != "static_plan" and row.max_total_tokens == row.static_plan_tokens:
        return "static, kept"
    return TOKENS_BY[row.tokens_source]


def _status(row: FitRow) -> str:
    """yes, or no and the short why (the whole line is the row's why_not, in --json)."""
    return "yes" if row.fits else {"target": "no: target", "one_request": "no: one request", "weights": "no: weights",
                                   "invalid": "no: layout"}[row.outcome]


def render_table(result: FitResult, *, show_all: bool) -> str:
    """The rows as aligned text, a count of the rows left out, and the cheapest row as a `plan` command."""
    nearest = sorted((r for r in result.rows if not r.fits), key=lambda r: r.closeness, reverse=True)[:CLOSEST_SHOWN]
    shown = [r for r in result.rows if show_all or r.fits or r in nearest]
    hidden = [r for r in result.rows if r not in shown]
    c = result.context_length
    head = ["", "card", "GPUs", "TP", "PP", "KV dtype", "weights/GPU", "KV budget", "max tokens", "tokens by",
            "max running", f"reqs @ {c:,}", "headroom", "fits"]
    lines = [[("*" if r.cheapest else ""), r.card, str(r.gpus), str(r.tp_size), str(r.pp_size),
              r.kv_cache_dtype_resolved or r.kv_cache_dtype, _gib(r.weights_bytes), _gib(r.budget_bytes),
              _count(r.max_total_tokens), _tokens_by(r), _count(r.max_running_requests),
              _count(r.requests_at_context), "-" if r.headroom is None else f"{r.headroom:.2f}x", _status(r)]
             for r in shown]
    right = {2, 3, 4, 6, 7, 8, 10, 11, 12}
    widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head) - 1)]

    def fmt(cells: list[str]) -> str:
        padded = [cells[i].rjust(widths[i]) if i in right else cells[i].ljust(widths[i]) for i in range(len(widths))]
        return "  ".join([*padded, cells[-1]]).rstrip()

    out = [f"{result.model}: {result.target.describe(c)}; {len(result.rows)} cells "
           f"({len(result.space.cards)} card{'s' if len(result.space.cards) != 1 else ''} x TP {','.join(map(str, result.space.tp_sizes))} x PP "
           f"{','.join(map(str, result.space.pp_sizes))} x KV {','.join(result.space.kv_cache_dtypes)}); "
           "GiB per GPU", fmt(head), *(fmt(line) for line in lines)]
    if hidden:
        why = {o: sum(r.outcome == o for r in hidden) for o in ("target", "one_request", "weights", "invalid")}
        words = {"target": "miss the target by more", "one_request": "hold no full request",
                 "weights": "do not hold the weights", "invalid": "cannot be laid out"}
        out.append(f"({len(hidden)} more rows: " + ", ".join(f"{n} {words[o]}" for o, n in why.items() if n)
                   + "; --all lists them)")
    if any(r.tokens_source == "vllm_answer" for r in shown):
        out.append("max tokens: vLLM 0.34.0's KV cache size (its blocks' requests of max_model_len tokens), its start-up "
                   "measurements estimated as in plan --engine vllm; reqs: whole requests its blocks hold besides the "
                   "null block, at most --max-num-seqs")
    elif any(r.tokens_source not in (None, "static_plan") for r in shown):
        out.append("max tokens: what a bootstrap with these flags holds: SGLang's static plan, or where the card's start "
                   "measures its headroom (--kv-headroom auto) the measured bootstrap's prediction, and how it was made "
                   "('static, kept': predicted to keep the static plan)")
    if result.cheapest is not None:
        r = result.cheapest
        out.append(f"* cheapest (fewest GPUs, then the least headroom over the target): "
                   f"{r.gpus} x {r.card} (TP {r.tp_size}, PP {r.pp_size}, KV {r.kv_cache_dtype}): "
                   f"{_count(r.requests_at_context)} requests of {c:,} tokens, {r.max_total_tokens:,} tokens in all")
    return "\n".join(out)
