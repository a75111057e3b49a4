"""`kvcache fit`: which card, TP size and KV dtype serve N requests of C tokens (or T tokens in all).

The swept flags take comma lists and keep ServerArgs' names (`--tp-size 1,2,4,8`); every other
ServerArgs flag is passed to each cell as `plan` takes it. Exit 0 when a cell fits, 3 when none
does (with the closest row and what it lacks), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, TextIO

from app.failures import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, Failure
from app.fit_advice import fit_fixes
from app.fit_plot import MISSING, have_matplotlib, plot_destination, write_plot
from app.fit_report import FIT_SCHEMA, FitResult, FitSpace, render_table
from app.fit_sweep import FitSweep, FitTarget, closest, ordered, run_sweep
from app.fit_vllm import VllmFitSweep
from app.server_args_flags import server_args_fields
from app.settings_file import checked_server_args
from kvcache.errors import ConfigError
from kvcache.inputs.cards import KNOWN_CARDS, SimulatedCard, card_named
from kvcache.inputs.pipeline_stages import stage_layer_counts
from kvcache.models.model_config import ModelConfig

SWEPT_FIELDS = frozenset({"tp_size", "pp_size", "kv_cache_dtype"})
DEFAULTS = {"tp_size": "1,2,4,8", "pp_size": "1", "kv_cache_dtype": "auto,fp8_e4m3"}
FP8_SPELLING = {"sglang": "fp8_e4m3", "vllm": "fp8"}  # each engine's name for e4m3 KV (vLLM's fp8_e4m3 differs on DSA)


def default_list(field: str, engine: str) -> str:
    """A swept field's default list, the KV dtypes spelled as --engine's rules spell them."""
    return f"auto,{FP8_SPELLING[engine]}" if field == "kv_cache_dtype" else DEFAULTS[field]
PROGRESS_AFTER_S = 1.0  # a sweep shorter than this needs no progress line


def add_fit_flags(p: argparse.ArgumentParser) -> None:
    """The sweep's own flags; the caller adds --model, --config, --json and the other ServerArgs flags."""
    group = p.add_argument_group("the target (one of) and the space to search")
    group.add_argument("--requests", type=_positive("--requests"), metavar="N",
                       help="requests to serve at once, each up to --context-length tokens")
    group.add_argument("--tokens", type=_positive("--tokens"), metavar="T", help="KV tokens to hold in all")
    group.add_argument("--gpu", default="all", metavar="NAMES",
                       help=f"cards to try, comma-separated, or all (default): {', '.join(KNOWN_CARDS)}")
    for f in server_args_fields():
        if f.field in SWEPT_FIELDS:
            group.add_argument(f.flag, *f.aliases, dest=f.field, default=None, metavar="LIST",
                               help=f"{f.description}: values to try, comma-separated (default: the --config "
                                    f"file's one value, else {DEFAULTS[f.field]}"
                                    + ("; auto,fp8 under --engine vllm)" if f.field == "kv_cache_dtype" else ")"))
    p.add_argument("--plot", metavar="FILE", help="also draw requests held at once vs context length (.png or .svg; "
                                                  "needs the optional extra: pip install 'kvcache-configurator[plot]')")
    p.add_argument("--all", action="store_true", dest="all_rows",
                   help="list every row, those that do not hold the weights too (--json always does)")


def _positive(flag: str) -> Callable[[str], int]:
    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
        return value
    return read


def _listed(text: str, flag: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ConfigError(f"{flag} {text!r}: give values separated by commas, e.g. {flag} {DEFAULTS.get(flag[2:].replace('-', '_'), 'a,b')}")
    return list(dict.fromkeys(items))


def _sizes(text: str, flag: str) -> list[int]:
    out = []
    for item in _listed(text, flag):
        value = int(item) if item.isdecimal() else 0  # digits of any script, as int() and the other flags read
        if value < 1:  # them; not '²', '+2' or '1_000', which isdigit() or int() alone would pass
            raise ConfigError(f"{flag} {text!r}: {item!r} is not a positive integer; e.g. {flag} 1,2,4,8")
        out.append(value)
    return out


def _dtypes(text: str) -> list[str]:
    choices = next(f.kind.values for f in server_args_fields() if f.field == "kv_cache_dtype")  # type: ignore[attr-defined]
    items = _listed(text, "--kv-cache-dtype")
    for item in items:
        if item not in choices:
            raise ConfigError(f"--kv-cache-dtype {text!r}: {item!r} is not one of {', '.join(choices)}; "
                              "e.g. --kv-cache-dtype auto,fp8_e4m3")
    return items


def _cards(text: str) -> list[SimulatedCard]:
    if text.strip().lower() == "all":
        return [card_named(name) for name in KNOWN_CARDS]
    return [card_named(name) for name in _listed(text, "--gpu")]  # an unknown name: one line naming the known ones


def fit_target(ns: argparse.Namespace, settings: dict[str, Any]) -> FitTarget:
    """The one target the flags name; --requests needs the request length (--context-length, vLLM's
    --max-model-len under --engine vllm)."""
    field = "max_model_len" if settings.get("engine") == "vllm" else "context_length"
    flag = "--" + field.replace("_", "-")
    if (ns.requests is None) == (ns.tokens is None):
        raise ConfigError(f"fit needs one target: --requests N {flag} C (N requests of C tokens at once) "
                          f"or --tokens T (T tokens in all), e.g. --requests 64 {flag} 32768")
    if ns.requests is not None and settings.get(field) is None:
        raise ConfigError(f"--requests {ns.requests} needs {flag} C, the tokens each request may reach "
                          f"(e.g. {flag} 32768)")
    return FitTarget(requests=ns.requests, tokens=ns.tokens, context_length=settings.get(field))


class Progress:
    """`fit: 40/96 cells` on stderr, rewritten in place, once the sweep has run a second; only on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._on = stream.isatty()
        self._start = time.perf_counter()
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if self._on and time.perf_counter() - self._start >= PROGRESS_AFTER_S:
            self._stream.write(f"\rfit: {done}/{total} cells")
            self._stream.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()


def swept_text(ns: argparse.Namespace, field: str, from_file: dict[str, Any], engine: str = "sglang") -> str:
    """A swept field's list as text: the flag's, else the settings file's one value (checked as ServerArgs checks
    it under --engine's rules, so a nonsense dtype there is refused, not dropped), else the default list."""
    given = getattr(ns, field)
    if given is not None:
        return str(given)
    if field not in from_file:
        return default_list(field, engine)
    checked = checked_server_args({field: from_file[field], "engine": engine}, from_file=from_file, flags={},
                                  path=ns.config)
    return str(getattr(checked, field))


def check_partition_fits_every_pp_size(partition: Any, pp_sizes: list[int], num_layers: int) -> None:
    """A --pp-layer-partition splits the layers over one PP size: refused up front (exit 2) when the sweep has
    others, naming the swept sizes it fits, rather than every other size's cells reading "no: layout"."""
    if not partition:
        return
    partition = tuple(partition)
    fits = [pp for pp in pp_sizes if _splits(num_layers, pp, partition)]
    if len(fits) == len(pp_sizes):
        return
    stages = len(partition)
    if not fits and not _splits(num_layers, stages, partition):  # no size takes it: the split's own refusal
        stage_layer_counts(num_layers, stages, partition)
    others = ",".join(str(pp) for pp in pp_sizes if pp not in fits)
    raise ConfigError(f"--pp-layer-partition {','.join(map(str, partition))} splits the layers over {stages} "
                      f"stages, so the sweep's --pp-size {others} cannot take it; use --pp-size "
                      f"{','.join(map(str, fits or [stages]))}, or leave out --pp-layer-partition to sweep SGLang's "
                      "own splits")


def _splits(num_layers: int, pp_size: int, partition: tuple[int, ...]) -> bool:
    try:
        stage_layer_counts(num_layers, pp_size, partition)
    except ConfigError:
        return False
    return True


def run_fit(ns: argparse.Namespace, model: ModelConfig, *, from_file: dict[str, Any], flags: dict[str, Any]) -> int:
    """Sweep, print the table (or JSON), draw the chart if asked; the exit code. `from_file` are the --config
    file's values (its swept fields restrict the sweep), `flags` the ServerArgs flags given, which override them."""
    flags = {k: v for k, v in flags.items() if k not in SWEPT_FIELDS}
    settings = {**from_file, **flags}
    engine = settings.get("engine", "sglang")
    cards = _cards(ns.gpu)
    tp_sizes = _sizes(swept_text(ns, "tp_size", from_file, engine), "--tp-size")
    pp_sizes = _sizes(swept_text(ns, "pp_size", from_file, engine), "--pp-size")
    dtypes = _dtypes(swept_text(ns, "kv_cache_dtype", from_file, engine))
    if ns.plot is not None:
        plot_destination(ns.plot)
    fixed = {k: v for k, v in settings.items() if k not in SWEPT_FIELDS}
    # exit 2 before the sweep, a file's bad value in the file's words
    checked_server_args({**fixed, "device": "meta", "tp_size": tp_sizes[0], "pp_size": pp_sizes[0],
                         "kv_cache_dtype": dtypes[0]}, from_file=from_file, flags=flags,
                        path=ns.config, model_layers=lambda: model.num_hidden_layers)
    check_partition_fits_every_pp_size(settings.get("pp_layer_partition"), pp_sizes, model.num_hidden_layers)
    target = fit_target(ns, settings)  # after the check: the length is named as --engine's rules name it
    sweep_class = VllmFitSweep if settings.get("engine") == "vllm" else FitSweep  # whose rules answer each cell
    sweep = sweep_class(model=model, settings=fixed, target=target)
    progress = Progress(sys.stderr)
    try:
        rows = ordered(run_sweep(sweep, cards, tp_sizes, pp_sizes, dtypes, on_cell=progress))
    finally:
        progress.clear()
    cheapest = next((r for r in rows if r.cheapest), None)
    nearest = closest(rows) if cheapest is None else None
    failure = None
    if nearest is not None:
        failure = Failure(kind="does_not_fit", exit_code=EXIT_DOES_NOT_FIT,
                          message=f"no cell of the sweep serves {target.describe(rows[0].context_length)}; closest: "
                                  f"{nearest.gpus} x {nearest.card} (TP {nearest.tp_size}, PP {nearest.pp_size}, KV "
                                  f"{nearest.kv_cache_dtype}): {nearest.why_not}",
                          suggestions=fit_fixes(sweep, rows, cards, tp_sizes, pp_sizes, dtypes) + (
                              [f"fp8 KV (--kv-cache-dtype {default_list('kv_cache_dtype', engine)})"]
                              if nearest.outcome != "weights" and FP8_SPELLING[engine] not in dtypes else []))
    result = FitResult(schema=FIT_SCHEMA, model=model.name, target=target, context_length=rows[0].context_length,
                       space=FitSpace(cards=[c.name for c in cards], tp_sizes=tp_sizes, pp_sizes=pp_sizes,
                                      kv_cache_dtypes=dtypes),
                       rows=rows, cheapest=cheapest, closest=nearest, error=failure)
    print(result.json() if ns.json else render_table(result, show_all=ns.all_rows))
    code = 0
    if ns.plot is not None:
        if have_matplotlib():
            write_plot(ns.plot, sweep, rows, {c.name: c for c in cards})
            if not ns.json:
                print(f"chart: {ns.plot}")
        else:
            print(f"kvcache: error: {MISSING}", file=sys.stderr)
            code = EXIT_BAD_INPUT
    if failure is not None:
        print(failure.line(), file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return code
