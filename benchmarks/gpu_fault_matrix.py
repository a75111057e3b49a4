"""Does a start-up that fails part-way leave nothing allocated? A fault at every hit of every fault point.

For each configuration it first bootstraps cleanly through the CLI (in this process) with a counting
kvcache.testing.faults.FaultInjector, then once more per hit of every point it saw (each arena, each pool and
allocator buffer, each graph capture and resize), failing that hit as the device fails it. Each faulted start
must exit 3 (does not fit: the device refused memory) in one line, and afterwards:
- CUDA: torch.cuda.memory_allocated() is back to what it was before the start (after gc), and no arena lives;
- CPU: no arena lives (the weights and KV arenas are anonymous mappings, unmapped with their last reference).
Last, on CUDA, a fresh process starts cleanly twice, then fails three starts at the KV arena, reading
cudaMemGetInfo's free bytes after each (gc, empty_cache): from the first start's end on (the CUDA context grows
once then, loading kernels and library handles) the driver must have every byte back after every start.

    python benchmarks/gpu_fault_matrix.py                 # CUDA when present
    python benchmarks/gpu_fault_matrix.py --device cpu    # the same walk on the CPU (no graphs, no resize)

Prints one PASS/FAIL row per injected fault and exits 1 when any row fails.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from app.cli import main  # noqa: E402
from app.forward import graphs  # noqa: E402
from kvcache.runtime import live_resize  # noqa: E402
from kvcache.testing.arena_census import ArenaCensus  # noqa: E402
from kvcache.testing.faults import FaultInjector  # noqa: E402
from kvcache.testing.fakes import TINY_MODEL_HF_CONFIG  # noqa: E402

# Every resize (post-capture, and both of the measured sizing's) takes kvcache.runtime.live_resize; its fault fails the
# mapping step, after the allocator was swapped, so a faulted start also checks the undo of the swap.
ENGINE_HOOKS = ((graphs.DecodeGraphs, "capture", "graph_capture"), (live_resize, "map_to_targets", "resize"))


def configurations(device: str, model: str) -> dict[str, list[str]]:
    """The starts to walk. --kv-cache-memory fixes the budget, which turns the post-capture resize (and with it VMM
    pools and graph capture at bootstrap) off, so the resizing starts cap the pools by tokens instead: the
    fraction's resize (uncapped at a small fraction, so that it shrinks), and the measured headroom (the default
    without a fraction), each hooked where it runs."""
    common = ["bootstrap", "--device", device, "--model", model, "--max-running-requests", "8"]
    base = [*common, "--kv-cache-memory", "64MiB"]
    if device == "cpu":
        return {"cpu": [*base, "--memory-limit", "1GiB"]}
    resizable = [*common, "--cuda-graph-max-bs", "8"]
    # The post-capture resize shrinks the pools by what capture took: uncapped, so that it changes the plan and
    # takes the live-resize road (a --max-total-tokens cap held both plans at the cap, and the road was never hit).
    return {"cuda": base,
            "cuda + graphs + resize": [*resizable, "--mem-fraction-static", "0.05", "--enable-post-capture-kv-resize"],
            "cuda + graphs + measured": [*resizable, "--max-total-tokens", "4096"]}


def allocated(device: str) -> int | None:
    """torch.cuda.memory_allocated() after collecting garbage; None on the CPU (its arenas are counted instead)."""
    gc.collect()
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def start(argv: list[str], injector: FaultInjector, census: ArenaCensus | None = None) -> tuple[int, str]:
    err = io.StringIO()
    with (census or ArenaCensus()).installed(), injector.installed(*ENGINE_HOOKS), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue().strip()


# How often a clean start of each configuration maps through the live-resize road: once after capture for the
# fraction's resize, twice for the measured sizing (the shrink to the static floor, then the measured plan).
RESIZES_EXPECTED = {"cuda + graphs + resize": 1, "cuda + graphs + measured": 2}


def walk(device: str, name: str, argv: list[str], max_hits: int | None = None) -> list[dict[str, Any]]:
    """Fail each hit of each fault point a clean start meets (the first `max_hits` of each, when given)."""
    counter = FaultInjector()
    code, line = start(argv, counter)
    if code != 0:
        return [{"config": name, "fault": "none (clean start)", "code": code, "ok": False, "note": line[:160]}]
    resizes, expected = counter.hits.get("resize", 0), RESIZES_EXPECTED.get(name, 0)
    rows = [{"config": name, "fault": "none (clean start)", "code": code, "ok": resizes == expected,
             "note": f"the live-resize road taken {resizes} times (expected {expected})"}]
    for point, hits in sorted(counter.hits.items()):
        if point == "collective":
            continue  # one process: no collectives (tests/test_rank_faults.py walks them on two ranks)
        for at in range(1, min(hits, max_hits or hits) + 1):
            before = allocated(device)
            injector, census = FaultInjector(point=point, at=at), ArenaCensus()  # type: ignore[arg-type]
            code, line = start(argv, injector, census)
            after = allocated(device)  # collects garbage first
            left = None if before is None or after is None else after - before
            arenas = census.alive()
            ok = injector.fired and code == 3 and line.count("\n") == 0 and not left and arenas == 0
            rows.append({"config": name, "fault": f"{point} #{at}", "code": code, "left_bytes": left,
                         "arenas_alive": arenas, "ok": ok, "note": line[:160]})
    return rows


FRESH_PROCESS = """
import contextlib, gc, io, json, sys
sys.path.insert(0, {root!r})
import torch
from app.cli import main
from kvcache.testing.faults import FaultInjector

def free():
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]

def start(fault):
    injector = FaultInjector(point="arena", at=2) if fault else FaultInjector()
    with injector.installed(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main({argv!r})

torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
cold = free()
codes = [start(False)]; warm = [free()]
codes.append(start(False)); warm.append(free())
for _ in range(3):
    codes.append(start(True)); warm.append(free())
print(json.dumps({{"codes": codes, "cold": cold, "free": warm}}))
"""


def fresh_process_check(argv: list[str]) -> dict[str, Any]:
    """cudaMemGetInfo in a process of its own (the driver's view): two clean starts, then three starts failed at the
    KV arena. The first start grows the CUDA context once (kernels loaded lazily, library handles): that is the
    context's, not a start's, so the baseline is the free memory after it; from there on neither a second clean
    start nor any failed one may leave a byte behind (a leak grows with every start)."""
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS.format(root=root, argv=argv)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"config": "fresh process", "fault": "arena #2 x3", "ok": False, "note": done.stderr.strip()[-160:]}
    r = json.loads(done.stdout.strip().splitlines()[-1])
    baseline, later = r["free"][0], r["free"][1:]
    left = baseline - min(later)
    ok = r["codes"] == [0, 0, 3, 3, 3] and left <= 0
    return {"config": "fresh process (cudaMemGetInfo)", "fault": "arena #2 x3", "code": r["codes"][-1], "left_bytes": left,
            "arenas_alive": 0, "ok": ok, "note": f"context growth at the first start {r['cold'] - baseline:,} B; free "
            f"after each later start {', '.join(f'{f:,}' for f in later)} B (baseline {baseline:,})"}


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="a preset or config.json (default: a 3-layer tiny Llama)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--max-hits", type=int, help="fail only the first N hits of each point (a quick walk)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = str(Path(tmp, "config.json"))
            Path(model).write_text(json.dumps({**TINY_MODEL_HF_CONFIG, "num_hidden_layers": 3}))
        rows = [row for name, argv in configurations(args.device, model).items() for row in walk(args.device, name, argv, args.max_hits)]
        if args.device == "cuda":
            rows.append(fresh_process_check(configurations("cuda", model)["cuda"]))
    print(f"{'configuration':<32} {'fault':<18} {'exit':>4} {'left (B)':>10} {'arenas':>6}  result  error line")
    for r in rows:
        print(f"{r['config']:<32} {r['fault']:<18} {r.get('code', '-')!s:>4} {'-' if r.get('left_bytes') is None else r['left_bytes']!s:>10} "
              f"{r.get('arenas_alive', '-')!s:>6}  {'PASS' if r['ok'] else 'FAIL':<6}  {r['note']}")
    failed = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - failed} PASS, {failed} FAIL on {args.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main_())
