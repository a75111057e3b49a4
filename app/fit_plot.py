"""`fit --plot FILE.png|svg`: requests held at once against context length, one line per card and TP.

Each point is one more cell of the sweep at that --context-length (the same planner). matplotlib
is an optional extra (`pip install 'kvcache-configurator[plot]'`); without it the table still
prints and the command says how to get the chart.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from app.failures import OutputUnwritableError
from app.fit_sweep import FitRow, FitSweep
from kvcache.errors import ConfigError
from kvcache.inputs.cards import SimulatedCard

PLOT_FORMATS = ("png", "svg")
MAX_PAIRS = 6  # card/TP pairs drawn (each in one colour, a line per KV dtype): more is no longer a picture
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
    """The rows that plan (fitting or short of the target) of the first card/TP/PP pairs in the table's order,
    every KV dtype of each pair."""
    planned = [r for r in rows if r.outcome in ("fits", "target")]
    pairs = list(dict.fromkeys((r.card, r.tp_size, r.pp_size) for r in planned))[:MAX_PAIRS]
    return [r for pair in pairs for r in planned if (r.card, r.tp_size, r.pp_size) == pair]


def write_plot(path: str, sweep: FitSweep, rows: list[FitRow], cards: dict[str, SimulatedCard]) -> int:
    """Plan every drawn line at each context length and save the chart; returns how many lines were drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or opened
    import matplotlib.pyplot as plt

    fmt = plot_format(path)
    context = rows[0].context_length if rows else sweep.model.context_length(None)
    xs = contexts(context, max(context, sweep.model.context_length(None)))
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = lines_to_draw(rows)
    pairs = list(dict.fromkeys((r.card, r.tp_size, r.pp_size) for r in drawn))
    pair_color = {pair: colors[i % len(colors)] for i, pair in enumerate(pairs)}
    for row in drawn:
        points = []
        for x in xs:
            cell = sweep.cell(cards[row.card], row.tp_size, row.pp_size, row.kv_cache_dtype, context=x)
            if cell.requests_at_context:
                points.append((x, cell.requests_at_context))
        if not points:
            continue
        label = (f"{row.card} TP{row.tp_size}" + (f" PP{row.pp_size}" if row.pp_size > 1 else "")
                 + f" {row.kv_cache_dtype_resolved}" + (" (cheapest)" if row.cheapest else ""))
        ax.plot(*zip(*points), marker="o", markersize=3, label=label, color=pair_color[(row.card, row.tp_size, row.pp_size)],
                linestyle="--" if (row.kv_cache_dtype_resolved or "").startswith("fp") else "-",
                linewidth=2.5 if row.cheapest else 1.4)
    t = sweep.target
    if t.requests is not None:
        ax.scatter([context], [t.requests], marker="*", s=260, color="black", zorder=5,
                   label=f"target: {t.requests:,} requests of {context:,} tokens")
        ax.axhline(t.requests, color="black", linestyle=":", linewidth=0.8)
    else:
        assert t.tokens is not None
        ax.plot(xs, [t.tokens / x for x in xs], color="black", linestyle=":", linewidth=1.2,
                label=f"target: {t.tokens:,} tokens in all")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x // 1024:,}K" if x % 1024 == 0 else f"{x:,}" for x in xs])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:,.0f}"))
    ax.set_xlabel("context length (tokens per request)")
    ax.set_ylabel("requests held at once")
    ax.set_title(f"{sweep.model.name}: requests held at once, per card and TP (dashed: fp8 KV)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    try:
        fig.savefig(path, format=fmt)
    except OSError as exc:  # removed or made read-only since the check, a full disk: the setup's, not a bug
        raise OutputUnwritableError(f"cannot write the chart --plot {path}: {exc.strerror or exc} (errno "
                                    f"{exc.errno}); give a path in a writable folder") from None
    finally:
        plt.close(fig)
    return len(drawn)
