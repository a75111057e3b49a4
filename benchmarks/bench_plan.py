"""Where a dry run's time goes: process start-up (imports) against the plan itself.

For every shipped preset on an H200, and for the heavy cases (DeepSeek-V3 with a NEXTN draft
at TP 8, a huge --max-running-requests, a refused plan whose advice re-plans many times), it
runs `app.cli.main(["plan", ...])` in this process and reports the median wall time of a few
calls, the time inside the planner and the advice (cProfile, cumulative), and how many
candidate plans were costed, and whether any of it imported torch (a dry run must not: app/dry_run.py). Then it
times whole `python -m app plan` processes, the default 70B `fit` sweep and a bare `import app.cli`, which is what
a user waits for.

    python benchmarks/bench_plan.py [--repeat 5] [--processes 3]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli import main  # noqa: E402
from kvcache.models.presets import preset_names  # noqa: E402

HEAVY: list[list[str]] = [
    ["DeepSeek-V3", "--tp-size", "8", "--speculative-algorithm", "NEXTN"],
    ["DeepSeek-V3", "--tp-size", "8", "--max-running-requests", "1000000"],
    ["DeepSeek-V3", "--tp-size", "8", "--max-running-requests", "100000", "--context-length", "4096"],
    ["Llama-3.1-8B-Instruct", "--max-running-requests", "1000000000", "--page-size", "16"],
]
FIT_MODEL = Path(__file__).resolve().parents[1] / "tests" / "model_corpus" / "Meta-Llama-3.1-70B.json"
PLANNER_FUNCS = {"plan_pool_sizes": "planning.py", "suggest_fixes": "advice.py", "plan_cost": "planning.py"}


def run_quietly(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


def planner_seconds(argv: list[str]) -> dict[str, tuple[int, float]]:
    """Calls and cumulative seconds of the planner's entry points for one run (under cProfile)."""
    profile = cProfile.Profile()
    profile.runcall(run_quietly, argv)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out = {name: (0, 0.0) for name in PLANNER_FUNCS}
    for (path, _, func), (_, calls, _, cumulative, _) in stats.items():
        if func in PLANNER_FUNCS and path.endswith(PLANNER_FUNCS[func]):
            n, s = out[func]
            out[func] = (n + calls, s + cumulative)
    return out


def in_process(argv: list[str], repeat: int) -> tuple[int, float, float]:
    """Exit code, first call's seconds and the median of `repeat` more."""
    t = time.perf_counter()
    rc = run_quietly(argv)
    first = time.perf_counter() - t
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run_quietly(argv)
        times.append(time.perf_counter() - t)
    return rc, first, statistics.median(times)


def process_seconds(args: list[str], processes: int) -> float:
    """Median wall seconds of a fresh `python args...` process."""
    times = []
    for _ in range(processes):
        t = time.perf_counter()
        subprocess.run([sys.executable, *args], capture_output=True, check=False, cwd=Path(__file__).parents[1])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main_bench(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--models", nargs="+", help="only these presets, without the heavy cases")
    opts = parser.parse_args(argv)
    cases = [[name] for name in opts.models] if opts.models else [[name] for name in preset_names()] + HEAVY
    print(f"{'case (plan --gpu H200)':78} rc  first ms  median ms  planner ms (plan_cost calls)  advice ms")
    for case in cases:
        argv = ["plan", "--model", *case, "--gpu", "H200"]
        rc, first, median = in_process(argv, opts.repeat)
        p = planner_seconds(argv)
        print(f"{' '.join(case):78} {rc}  {first * 1e3:8.1f}  {median * 1e3:9.1f}  "
              f"{p['plan_pool_sizes'][1] * 1e3:10.1f} ({p['plan_cost'][0]:5d})  {p['suggest_fixes'][1] * 1e3:9.1f}")
    print(f"torch imported by these plans: {'yes' if 'torch' in sys.modules else 'no'}")
    heavy = ["-m", "app", "plan", "--model", *HEAVY[0], "--gpu", "H200"]
    fit = ["-m", "app", "fit", "--model", str(FIT_MODEL), "--requests", "64", "--context-length", "32768"]
    if not opts.processes:
        return
    print(f"\nprocess `python -c 'import app.cli'`: {process_seconds(['-c', 'import app.cli'], opts.processes):.2f} s")
    for argv in (["-m", "app", "plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H200"], heavy, fit):
        print(f"process `python {' '.join(argv)}`: {process_seconds(argv, opts.processes):.2f} s")


if __name__ == "__main__":
    main_bench()
