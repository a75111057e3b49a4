"""`fit --plot FILE.png|svg`: requests held at once against context length, a panel per card, a line per TP and KV dtype.

Every card/TP pair that plans is drawn; the pairs that do not are named at the foot of the chart, and lines
with the same points are drawn once with their labels joined (one would hide the other).

Each point is one more cell of the sweep at that --context-length (the same planner). matplotlib
is an optional extra (`pip install 'kvcache-configurator[plot]'`); without it the table still
prints and the command says how to get the chart.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from app.failures import OutputUnwritableError
from app.fit_sweep import FitRow, FitSweep
from kvcache.errors import ConfigError
from kvcache.inputs.cards import SimulatedCard

PLOT_FORMATS = ("png", "svg")
SHORTEST_CONTEXT = 1024
MISSING = "--plot needs matplotlib, an optional extra: pip install 'kvcache-configurator[plot]' (or pip install matplotlib)"


def plot_format(path: str) -> str:
    """The chart's format from FILE's suffix (png or svg); anything else is bad input."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise ConfigError(f"--plot {path}: the file must end in .png or .svg (e.g. --plot fit.png)")
    return suffix


def plot_destination(path: str) -> str:
    """The chart's format, once FILE can be written where it is asked: its folder exists and is a folder (checked
    before the sweep, so a typo in the path costs no sweep and is bad input, exit 2)."""
    fmt = plot_format(path)
    folder = Path(path).parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(f"--plot {path}: the folder {folder} {why}; create it first or give a path in an existing "
                          "folder (e.g. --plot fit.png)")
    return fmt


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def contexts(target_context: int, longest: int) -> list[int]:
    """Powers of two from 1K up to the model's context, with the target's and the longest one."""
    points = {target_context, longest}
    n = SHORTEST_CONTEXT
    while n < longest:
        points.add(n)
        n *= 2
    return sorted(p for p in points if p <= longest)


def lines_to_draw(rows: list[FitRow]) -> list[FitRow]:
    """Every row that plans (fitting or short of the target), in the table's order: each card/TP/PP pair with each
    KV dtype. Rows that do not plan have no line; `left_out` names them."""
    return [r for r in rows if r.outcome in ("fits", "target")]


def left_out(rows: list[FitRow]) -> str:
    """The card/TP/PP pairs drawn nowhere (none of their cells plans), by card: '' when every pair has a line."""
    drawn = {(r.card, r.tp_size, r.pp_size) for r in lines_to_draw(rows)}
    missing: dict[str, list[str]] = {}
    for r in rows:
        pair = (r.card, r.tp_size, r.pp_size)
        name = f"TP{r.tp_size}" + (f" PP{r.pp_size}" if r.pp_size > 1 else "")
        if pair not in drawn and name not in missing.get(r.card, []):
            missing.setdefault(r.card, []).append(name)
    if not missing:
        return ""
    return "not drawn (no KV dtype plans: the weights, one request or the layout): " + "; ".join(
        f"{card} {', '.join(names)}" for card, names in missing.items())


def merged(lines: list[tuple[str, tuple[tuple[int, int], ...]]]) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
    """Lines with the same points drawn once, their labels joined ('TP4 bfloat16 = TP8 bfloat16'): one line drawn
    over another would hide it."""
    out: dict[tuple[tuple[int, int], ...], list[str]] = {}
    for label, points in lines:
        out.setdefault(points, []).append(label)
    return [(" = ".join(labels), points) for points, labels in out.items()]


def write_plot(path: str, sweep: FitSweep, rows: list[FitRow], cards: dict[str, SimulatedCard]) -> int:
    """Plan every drawn line at each context length and save the chart, a panel per card (every pair that plans, on
    shared axes); returns how many lines were drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or opened
    import matplotlib.pyplot as plt

    fmt = plot_format(path)
    context = rows[0].context_length if rows else sweep.model.context_length(None)
    xs = contexts(context, max(context, sweep.model.context_length(None)))
    drawn = lines_to_draw(rows)
    by_card: dict[str, list[FitRow]] = {}
    for row in drawn:
        by_card.setdefault(row.card, []).append(row)
    panels = max(len(by_card), 1)
    columns = min(panels, 3)
    grid_rows = -(-panels // columns)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # labels stay text in an SVG (searchable, testable)
        fig, axes = plt.subplots(grid_rows, columns, figsize=(5.2 * columns, 3.6 * grid_rows + 0.8), dpi=110,
                                 sharex=True, sharey=True, squeeze=False)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        pairs = sorted({(r.tp_size, r.pp_size) for r in drawn})  # a TP/PP size has one colour on every panel
        count = 0
        for ax, (card, card_rows) in zip(axes.flat, by_card.items()):
            lines = []
            for row in card_rows:
                points = tuple((x, cell.requests_at_context) for x in xs
                               if (cell := sweep.cell(cards[row.card], row.tp_size, row.pp_size, row.kv_cache_dtype,
                                                      context=x)).requests_at_context)
                if points:
                    lines.append((_label(row), points))
            for label, points in merged(lines):
                first = next(r for r in card_rows if _label(r) == label.split(" = ")[0])
                cheapest = any(r.cheapest and _label(r) in label.split(" = ") for r in card_rows)
                ax.plot(*zip(*points), marker="o", markersize=3, label=label,
                        color=colors[pairs.index((first.tp_size, first.pp_size)) % len(colors)],
                        linestyle="--" if (first.kv_cache_dtype_resolved or "").startswith("fp") else "-",
                        linewidth=2.5 if cheapest else 1.4)
                count += 1
            _target(ax, sweep, xs, context)
            ax.set_title(card, fontsize=10)
            ax.legend(fontsize=7, loc="lower left")  # the lines fall to the right
        for ax in list(axes.flat)[len(by_card):]:
            ax.set_visible(False)
        _axes(matplotlib, axes, xs)
        fig.suptitle(f"{sweep.model.name}: requests held at once, per card, TP and KV dtype (dashed: fp8 KV; "
                     "lines with the same points are drawn once, labels joined by =)", fontsize=10)
        note = left_out(rows)
        if note:
            fig.text(0.01, 0.005, note, fontsize=7, va="bottom", wrap=True)
        fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 0.96))
        try:
            fig.savefig(path, format=fmt)
        except OSError as exc:  # removed or made read-only since the check, a full disk: the setup's, not a bug
            raise OutputUnwritableError(f"cannot write the chart --plot {path}: {exc.strerror or exc} (errno "
                                        f"{exc.errno}); give a path in a writable folder") from None
        finally:
            plt.close(fig)
    return count


def _label(row: FitRow) -> str:
    return (f"TP{row.tp_size}" + (f" PP{row.pp_size}" if row.pp_size > 1 else "") + f" {row.kv_cache_dtype_resolved}"
            + (" (cheapest)" if row.cheapest else ""))


def _target(ax: Any, sweep: FitSweep, xs: list[int], context: int) -> None:
    """The target on one panel: a star at (context, requests), or the tokens' curve."""
    t = sweep.target
    if t.requests is not None:
        ax.scatter([context], [t.requests], marker="*", s=160, color="black", zorder=5,
                   label=f"target: {t.requests:,} x {context:,}")
        ax.axhline(t.requests, color="black", linestyle=":", linewidth=0.8)
    else:
        assert t.tokens is not None
        ax.plot(xs, [t.tokens / x for x in xs], color="black", linestyle=":", linewidth=1.2,
                label=f"target: {t.tokens:,} tokens")


def _axes(matplotlib: Any, axes: Any, xs: list[int]) -> None:
    """Log axes, context ticks in K, request counts with separators; labels on the outer panels."""
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x // 1024:,}K" if x % 1024 == 0 else f"{x:,}" for x in xs], fontsize=7)
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:,.0f}"))
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[-1, :]:
        ax.set_xlabel("context length (tokens per request)")
    for ax in axes[:, 0]:
        ax.set_ylabel("requests held at once")
