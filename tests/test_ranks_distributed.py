"""Two real ranks over gloo on the CPU: TP 2, PP 2, a forced imbalance, a rank that fails to build.

One start of two processes runs every scenario through the CLI (tests/rank_worker.py),
each under torchrun's environment; the tests below assert on what each rank saw. The
ranks fork from pytest (spawning would import torch once more per rank) and run torch
single-threaded: a forked child that entered the parent's OpenMP pool would hang.

The model is the tiny Llama of kvcache.testing with 3 layers (2 KV heads of 16, bf16:
128 bytes per layer per token), a 16 MiB KV budget, page size 1, 8 requests. A worker's
buffers sit in one arena (a 2 MiB multiple, at least 10 MiB), each in a 512-byte aligned
slot; the table takes 9 x 256 x 4 = 9,216 B and the allocator's two free logs 16 B per token each.
By hand:
- TP 2: 1 KV head per rank, 3 x 64 = 192 B/token. At 74,852 tokens the pool's 74,853 x 192
  = 14,371,776 B take a 14,371,840 B slot and each log's 1,197,632 B a 1,198,080 B one:
  9,216 + 14,371,840 + 2 x 1,198,080 = 16,777,216, the table exactly 16 MiB; one token more
  (pool slot 14,372,352) does not fit. Both ranks: 74,852.
- PP 2: stage 0 holds layers 0-1 (256 B/token): at 58,219 tokens the pool is 58,220 x 256
  = 14,904,320 B and each log S(931,504) = 931,840 B: 9,216 + 14,904,320 + 2 x 931,840 =
  16 MiB exactly. Stage 1 holds layer 2 (128 B/token) and alone would hold 104,799; it holds
  58,219, the smallest stage's count: 9,216 + 7,452,160 + 2 x 931,840 = 9,325,056 B of slots
  in a 10 MiB arena instead of stage 0's 16 MiB.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

import rank_worker
from kvcache.testing.fakes import TINY_MODEL_HF_CONFIG

SPAWN_TIMEOUT_S = 120
pytestmark = rank_worker.NEEDS_GLOO



@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both ranks' results, scenario by scenario."""
    tmp = tmp_path_factory.mktemp("ranks")
    model = tmp / "config.json"
    model.write_text(json.dumps({**TINY_MODEL_HF_CONFIG, "num_hidden_layers": 3}))
    ports = {name: rank_worker.free_port() for name in ("tp2", "pp2", "imbalance", "imbalance_relaxed", "build_fails", "embedded")}
    context = mp.start_processes(rank_worker.run_rank, args=(str(model), ports, str(tmp)), nprocs=2,
                                 join=False, start_method="fork")
    try:
        while not context.join(timeout=SPAWN_TIMEOUT_S):
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def _pool(rank_json: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in rank_json["plan"]["kv_pools"] if p["name"] == name)


def test_every_rank_tears_down_the_group_it_created_and_only_that(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert [name for name, result in rank.items() if result["group_left"]] == ["embedded"]
        assert rank["embedded"]["code"] == 0
    assert json.loads(ranks[0]["embedded"]["stdout"])["ranks"][1]["max_total_num_tokens"] == 58_217


def test_tp2_ranks_split_the_heads_and_agree(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["tp2"] for r in ranks)
    assert rank0["code"] == rank1["code"] == 0
    assert rank1["stdout"] == ""  # rank 0 prints for everyone
    report = json.loads(rank0["stdout"])
    assert [(p["name"], p["layers"], p["bytes_per_token"], p["max_total_num_tokens"]) for p in report["ranks"]] == [
        ("rank 0 (tp 0/2, pp 0/1)", [0, 3], 192, 74_849),
        ("rank 1 (tp 1/2, pp 0/1)", [0, 3], 192, 74_849),
    ]
    assert all(p["allocated_bytes"] == p["planned_bytes"] for p in report["ranks"])
    assert report["buffers"]["kv_full"] == 14_371_328


def test_pp2_stages_plan_their_own_layers_and_hold_the_smallest_count(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["pp2"] for r in ranks)
    assert rank0["code"] == rank1["code"] == 0 and rank1["stdout"] == ""
    plans = json.loads(rank0["stdout"])["ranks"]
    assert [(p["layers"], p["bytes_per_token"], p["max_total_num_tokens"]) for p in plans] == [
        ([0, 1], 128, 58_217), ([1, 3], 256, 58_217),  # 3 layers: 1 + 2, the extra one on the last stage (SGLang's)
    ]
    assert [p["planned_bytes"] for p in plans] == [10 * 1024 * 1024, 16 * 1024 * 1024]


def test_a_layout_that_is_not_the_world_is_refused_on_every_rank_in_one_line(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["mismatch"] for r in ranks)
    assert rank0["code"] == rank1["code"] == 2  # every rank exits with it; only rank 0 says it, once
    assert rank0["stderr"].count("\n") == 1 and rank1["stderr"] == "" and rank1["stdout"] == ""
    assert "launcher started 2 ranks but --tp-size 4 x --pp-size 1 = 4" in rank0["stderr"]
    assert json.loads(rank0["stdout"])["error"]["kind"] == "bad_input"


def test_unbalanced_memory_is_the_same_typed_error_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["imbalance"] for r in ranks)
    assert rank0["code"] == rank1["code"] == 3
    assert rank0["stderr"].count("\n") == 1 and rank1["stderr"] == ""  # the agreed error, said once
    first_line = rank0["stderr"].splitlines()[0]
    assert "free memory before loading weights is unbalanced across ranks: rank 0 (tp 0/2, pp 0/1) " in first_line
    assert "rank 1 (tp 1/2, pp 0/1) 0.2" in first_line  # 256 MiB less what the process grew by
    assert "--min-rank-memory-ratio 0.9" in first_line and "memory on rank 1" in first_line
    suggested = re.search(r"--min-rank-memory-ratio (0\.\d+) \(every rank", rank0["stderr"])
    assert suggested and 0.2 <= float(suggested.group(1)) <= 0.25  # about 256 MiB / 1 GiB, rounded down


def test_a_relaxed_ratio_lets_unbalanced_ranks_start_on_the_smallest(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["imbalance_relaxed"] for r in ranks)
    assert rank0["code"] == rank1["code"] == 0
    report = json.loads(rank0["stdout"])
    by_rank = [p["free_before_load_bytes"] for p in report["ranks"]]
    # every rank plans with rank 1's; rank 0's report pairs its own weights with its own readings, and names the smallest
    assert report["plan"]["budget"]["free_before_load_bytes"] == min(by_rank) == by_rank[1]
    assert report["ranks_smallest_memory"]["free_before_load_bytes"] == by_rank[1]
    assert report["free_before_load_bytes"] == by_rank[0]
    assert by_rank[1] <= 256 * 1024 * 1024 < by_rank[0] <= 1024 * 1024 * 1024


def test_a_rank_that_fails_to_build_stops_every_rank_and_leaves_nothing(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["build_fails"] for r in ranks)
    assert rank0["code"] == rank1["code"] == 3
    assert rank0["stderr"].count("\n") == 1 and rank1["stderr"] == ""  # rank 1's failure, said by rank 0
    assert rank0["stderr"].startswith("kvcache: does not fit: out of memory: rank 1 (tp 1/2, pp 0/1): building the KV pools")
    assert "out of memory (simulated on rank 1)" in rank0["stderr"]
    assert rank0["buffers_made"] >= 3 and rank1["buffers_made"] == 1  # rank 0 built all its pools
    assert rank0["buffers_alive"] == rank1["buffers_alive"] == 0
    assert rank0["arenas_alive"] == rank1["arenas_alive"] == 0
