"""A failure at any allocation or collective of a two-rank start (gloo, CPU) stops every rank at once with the
same typed error and leaves nothing allocated; a rank killed mid-start makes the other exit, not wait.

One pair of processes joins one process group and walks the fault points of kvcache.testing.faults on rank 1
(rank 0 runs clean): the weights arena, the KV arena, the last pool/allocator buffer, a collective in the middle
of the start (the stage plan), and last a SIGKILL at the KV arena; benchmarks/gpu_fault_matrix.py walks every
hit of every point in one process. A clean start first counts the points (and must
pass). The tiny Llama of test_ranks_distributed.py, TP 2, a 16 MiB KV budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

import rank_worker
from kvcache.testing.fakes import TINY_MODEL_HF_CONFIG

pytestmark = rank_worker.NEEDS_GLOO
# A clean start hits 2 arenas (weights, KV), 4 buffers and 12 collectives on each rank (counted in the first step).
WALK = [("arena", 0, "raise"), ("arena", 1, "raise"), ("arena", 2, "raise"), ("buffer", 4, "raise"),
        ("collective", 6, "raise"), ("arena", 2, "kill")]
LIVENESS_S = 120  # a rank still waiting after this is hung in a collective (torch's own timeout is minutes)
LOST = ("kvcache: rank lost: the ranks stopped agreeing: another rank failed or was killed during start-up "
        "(2 ranks; the failing rank's own output says why); nothing is left allocated here\n")


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("faults")
    model = tmp / "config.json"
    model.write_text(json.dumps({**TINY_MODEL_HF_CONFIG, "num_hidden_layers": 3}))
    context = mp.start_processes(rank_worker.run_fault_walk, args=(str(model), rank_worker.free_port(), WALK, str(tmp)),
                                 nprocs=2, join=False, start_method="fork")
    try:
        context.processes[0].join(LIVENESS_S)
        context.processes[1].join(LIVENESS_S)
        assert not any(p.is_alive() for p in context.processes), "a rank still waits: it should have exited"
        assert context.processes[0].exitcode == 0 and context.processes[1].exitcode == -9  # SIGKILLed, last step
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def test_a_clean_start_hits_every_fault_point_the_walk_arms(walked: list[list[dict[str, Any]]]) -> None:
    for rank in walked:
        assert rank[0]["code"] == 0 and rank[0]["hits"] == {"arena": 2, "buffer": 4, "collective": 12}
    assert [step["fired"] for step in walked[1][1:]] == [True] * 4


@pytest.mark.parametrize(("step", "code", "says"), [
    # the free bytes are the host probe's reading: the 256 MiB limit less this process's RSS growth (a page or so)
    (1, 3, "kvcache: does not fit: rank 1 (tp 1/2, pp 0/1): faults0's target weights (0.01 GiB (10,485,760 B) on "
           "this rank) could not be allocated on cpu although 0.25 GiB (268,4"),
    (2, 3, "kvcache: does not fit: out of memory: rank 1 (tp 1/2, pp 0/1): building the KV pools"),
    (3, 3, "kvcache: does not fit: out of memory: rank 1 (tp 1/2, pp 0/1): building the KV pools"),
    (4, 4, LOST),
], ids=["weights arena", "KV arena", "last buffer", "a collective"])
def test_a_fault_on_one_rank_stops_every_rank_with_the_same_error(walked: list[list[dict[str, Any]]], step: int,
                                                                   code: int, says: str) -> None:
    rank0, rank1 = walked[0][step], walked[1][step]
    assert rank0["code"] == rank1["code"] == code
    assert rank0["stderr"].startswith(says) and rank0["stderr"].count("\n") == 1
    # an agreed failure is said once, by rank 0 (issue 22); a lost rank by every survivor (rank 0 may be the lost one)
    assert rank1["stderr"] == (rank0["stderr"] if code == 4 else "")
    assert rank0["arenas_alive"] == rank1["arenas_alive"] == 0  # weights and KV arenas released on both ranks


def test_a_rank_killed_mid_start_makes_the_other_exit(walked: list[list[dict[str, Any]]]) -> None:
    survivor = walked[0][-1]
    assert survivor["code"] == 4 and survivor["stderr"] == LOST and survivor["arenas_alive"] == 0
    assert len(walked[1]) == len(WALK) - 1  # rank 1 never wrote its last step: it was killed in it
