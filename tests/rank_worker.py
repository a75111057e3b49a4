"""One rank of a 2-process gloo world, spawned by tests/test_ranks_distributed.py.

Each scenario runs the real CLI (`app.cli.main`) with torchrun's environment set, so
the container Resource creates the process group and must destroy it again; the rank
writes what it saw (exit code, stdout, stderr, whether a group is left, pool tensors
still alive) to `<out_dir>/rank<r>.json` for the test to assert on.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import socket
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from app.cli import main
from kvcache.memory import device_buffers
from kvcache.testing.arena_census import ArenaCensus

NEEDS_GLOO = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no gloo process groups")


def free_port() -> int:
    """A TCP port nobody listens on now, for one 2-rank world's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


COMMON = ["bootstrap", "--device", "cpu", "--max-running-requests", "8", "--json"]


def scenarios(model: str, rank: int) -> dict[str, list[str]]:
    """Scenario name -> CLI arguments for this rank."""
    base = [*COMMON, "--model", model, "--memory-limit", "256MiB", "--kv-cache-memory", "16MiB"]
    uneven = [*COMMON, "--model", model, "--kv-cache-memory", "16MiB", "--tp-size", "2",
              "--memory-limit", "1GiB" if rank == 0 else "256MiB"]
    return {
        "mismatch": [*base, "--tp-size", "4"],
        "tp2": [*base, "--tp-size", "2"],
        "pp2": [*base, "--pp-size", "2"],
        "imbalance": uneven,
        "imbalance_relaxed": [*uneven, "--min-rank-memory-ratio", "0.2"],
        "build_fails": [*base, "--tp-size", "2"],
        "embedded": [*base, "--pp-size", "2"],  # the caller owns the default group
    }


def _failing_allocations(rank: int, made: list[weakref.ref[torch.Tensor]]) -> Any:
    """Arena.carve_slot that records every buffer carved; on rank 1 the second one (after the request table) runs
    out of memory."""
    real = device_buffers.Arena.carve_slot

    def carve(arena: device_buffers.Arena, parts: Any) -> list[torch.Tensor]:
        if rank == 1 and made:
            raise torch.OutOfMemoryError("out of memory (simulated on rank 1)")
        views = real(arena, parts)
        made.append(weakref.ref(views[0]))
        return views

    return carve


def run_rank(rank: int, model: str, ports: dict[str, int], out_dir: str) -> None:
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool (it hangs)

    results: dict[str, Any] = {}
    real_carve = device_buffers.Arena.carve_slot
    for name, argv in scenarios(model, rank).items():
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(ports.get(name, 1)))
        made: list[weakref.ref[torch.Tensor]] = []
        if name == "build_fails":
            device_buffers.Arena.carve_slot = _failing_allocations(rank, made)  # type: ignore[method-assign]
        if name == "embedded":
            dist.init_process_group("gloo", init_method="env://")
        out, err = io.StringIO(), io.StringIO()
        census = ArenaCensus()
        with census.installed(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        device_buffers.Arena.carve_slot = real_carve  # type: ignore[method-assign]
        gc.collect()
        results[name] = {
            "code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "group_left": dist.is_initialized(), "buffers_made": len(made),
            "buffers_alive": sum(ref() is not None for ref in made),
            "arenas_alive": census.alive(),  # weights and KV arenas still referenced anywhere
        }
        if name == "embedded" and dist.is_initialized():
            dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


# ---- fault injection: one process group, a walk over the fault points (tests/test_rank_faults.py) -------------------

FAULT_ARGV = ["bootstrap", "--device", "cpu", "--memory-limit", "256MiB", "--kv-cache-memory", "16MiB",
              "--max-running-requests", "8", "--tp-size", "2"]


def run_fault_walk(rank: int, model: str, port: int, walk: list[tuple[str, int, str]], out_dir: str) -> None:
    """Join one gloo group (as an embedding engine would: the CLI then uses it and leaves it), then bootstrap once
    per step of `walk`, rank 1 armed with (point, at, action) and rank 0 clean; a step with at == 0 only counts.
    Each step's exit code, stderr, the hits this rank saw and the arenas still alive go to rank<r>.json, written
    after every step (a 'kill' step ends rank 1 there)."""
    from kvcache.testing.faults import FaultInjector

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method="env://")
    results: list[dict[str, Any]] = []
    for point, at, action in walk:
        armed = rank == 1 and at > 0
        injector = FaultInjector(point=point, at=at, action=action) if armed else FaultInjector()  # type: ignore[arg-type]
        err, census = io.StringIO(), ArenaCensus()
        with census.installed(), injector.installed(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(err):
            code = main([*FAULT_ARGV, "--model", model])
        gc.collect()
        results.append({"step": f"{point} #{at} {action}", "code": code, "stderr": err.getvalue(),
                        "hits": dict(injector.hits), "fired": injector.fired, "arenas_alive": census.alive()})
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
