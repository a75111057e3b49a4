"""What `fit` costs: one cell, the default sweep for Llama-3.1-70B, and the whole command as a user runs it.

In this process: the default sweep (12 cards x TP 1,2,4,8 x KV auto,fp8_e4m3 = 96 cells) through
FitSweep, first run and the median of a few more (a fresh FitSweep each: nothing carried over), with
the seconds spent building combinations (one EngineContainer per TP x PP x dtype, weights counted
once per TP x PP) and planning cells; and, for comparison, the same 96 cells as 96 in-process
`plan` runs (what an operator did before `fit`). Then whole `python -m app fit ...` processes: wall
seconds and CPU seconds (user + system, from the child's rusage), since a shared machine's wall clock
says more about its neighbours than about the command.

    python benchmarks/bench_fit.py [--repeat 3] [--processes 3] [--skip-plan-loop]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.cli import main  # noqa: E402
from app.fit_sweep import FitSweep, FitTarget, run_sweep  # noqa: E402
from kvcache.inputs.cards import KNOWN_CARDS, card_named  # noqa: E402
from kvcache.models.presets import load_model_config  # noqa: E402

MODEL = str(REPO / "tests" / "model_corpus" / "Meta-Llama-3.1-70B.json")
TP_SIZES, DTYPES = [1, 2, 4, 8], ["auto", "fp8_e4m3"]
FIT_ARGS = ["fit", "--model", MODEL, "--requests", "64", "--context-length", "32768"]


def one_sweep() -> tuple[float, float, int]:
    """(seconds in all, seconds building combinations, cells) for a fresh default sweep: the combinations are
    built first (timed apart), then run_sweep plans every cell on them."""
    sweep = FitSweep(model=load_model_config(MODEL), settings={}, target=FitTarget(requests=64, context_length=32768))
    cards = [card_named(c) for c in KNOWN_CARDS]
    start = time.perf_counter()
    for tp in TP_SIZES:
        for dtype in DTYPES:
            sweep.combination(tp, 1, dtype, 32768)
    built = time.perf_counter() - start
    rows = run_sweep(sweep, cards, TP_SIZES, [1], DTYPES)
    return time.perf_counter() - start, built, len(rows)


def plan_loop() -> float:
    """Seconds for the same 96 cells as in-process `plan` runs."""
    start = time.perf_counter()
    for card in KNOWN_CARDS:
        for tp in TP_SIZES:
            for dtype in DTYPES:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    main(["plan", "--model", MODEL, "--gpu", card, "--tp-size", str(tp), "--kv-cache-dtype", dtype,
                          "--context-length", "32768"])
    return time.perf_counter() - start


def process(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `python -m app ARGS` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main_bench(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--skip-plan-loop", action="store_true")
    opts = parser.parse_args(argv)
    first, first_built, cells = one_sweep()
    runs = [one_sweep() for _ in range(opts.repeat)] or [(first, first_built, cells)]
    total = statistics.median(r[0] for r in runs)
    built = statistics.median(r[1] for r in runs)
    print(f"default sweep, {cells} cells: first {first:.2f} s (building {first_built:.2f} s); "
          f"median {total:.2f} s (building {built:.2f} s for 8 combinations, planning {total - built:.2f} s)")
    print(f"per cell: {total / cells * 1e3:.1f} ms in all, {(total - built) / cells * 1e3:.1f} ms planning")
    if not opts.skip_plan_loop:
        loop = plan_loop()
        print(f"the same cells as {cells} in-process `plan` runs: {loop:.2f} s ({loop / cells * 1e3:.0f} ms per cell)")
    for label, args in (("python -m app fit (default sweep)", FIT_ARGS),
                        ("python -m app fit --plot", [*FIT_ARGS, "--plot", "/tmp/bench_fit.png"]),
                        ("python -m app --help (start-up alone)", ["--help"])) if opts.processes else ():
        measured = [process(args) for _ in range(opts.processes)]
        print(f"{label}: wall {statistics.median(m[0] for m in measured):.2f} s, "
              f"CPU {statistics.median(m[1] for m in measured):.2f} s")


if __name__ == "__main__":
    main_bench()
