"""The post-capture resize on two real ranks (gloo on the CPU): one rank that refuses stops every rank before any shrinks.

Each rank builds the tiny page-16 runner of test_resize_apply with 40 MiB free after
"capture" (under the 512 MiB headroom, so both decide to shrink) and a fake VMM backing
that records what it is told to keep. Rank 1 holds every token, so live tokens lie in the
tail it would cut: it refuses, and rank 0, whose own shrink would succeed, must neither
rebuild its allocator nor release a byte. Then rank 1 frees them and its release fails:
rank 0 maps back what it released. The ranks fork from pytest, single-threaded (as in
test_ranks_distributed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rank_worker
from test_resize_apply import FakeBacking

pytestmark = rank_worker.NEEDS_GLOO



def _resize_on_rank(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool (it hangs)
    from app.forward.post_capture import apply_post_capture_resize
    from containers import EngineContainer
    from kvcache.errors import KVCacheError
    from kvcache.inputs.parallel import ParallelState, ProcessGroups
    from kvcache.memory.torch_collectives import TorchRankGroup
    from kvcache.inputs.server_args import ServerArgs
    from kvcache.inputs.sizing_settings import SizingSettings
    from kvcache.testing import FixedMemoryProbe, tiny_model_config

    args = ServerArgs.from_mapping({"device": "cpu", "mem_fraction_static": 0.5, "memory_limit": 1 << 30,
                                    "page_size": 16, "max_running_requests": 8})
    engine = EngineContainer(server_args=args, model_config=tiny_model_config())
    probe = FixedMemoryProbe(total_bytes=1 << 30)
    engine.memory_probe.override(probe)
    runner = engine.engine().target
    runner.initialize()  # alone: the engine's own parallel state plans one rank; the group below only agrees
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    allocator = runner.token_to_kv_pool_allocator
    held = allocator.alloc(64 if rank == 0 else allocator.available_size())
    probe.note_allocation(probe.free_bytes() - 40 * 1024 * 1024)
    groups = ProcessGroups(agreement=TorchRankGroup(dist.group.WORLD, 2), tp=None, pp=None, attention_tp=None, attention_dp=None)
    ranks = ParallelState(tp_size=2, tp_rank=rank, groups=groups)
    seen = {}
    for scenario in ("live_tokens_in_tail", "release_fails"):
        if scenario == "release_fails" and rank == 1:
            allocator.free(held[64:])  # now only rank 1's release fails
        free_before, size_before = allocator.available_size(), runner.token_to_kv_pool.size
        backing = FakeBacking(runner.token_to_kv_pool, fails=scenario == "release_fails" and rank == 1)
        try:
            apply_post_capture_resize(
                kv_cache=runner.kv_cache, backing=backing, settings=SizingSettings.from_server_args(args),
                parallel_state=ranks, memory_probe=probe, pre_model_load_memory=runner.pre_model_load_memory,
                captured_max_bs=8, allocator_factory=runner._configurator_factory().allocator_factory)
            error: Any = None
        except KVCacheError as exc:
            error = [type(exc).__name__, str(exc)]
        seen[scenario] = {"error": error, "free": [free_before, allocator.available_size()],
                          "pool_size": [size_before, runner.token_to_kv_pool.size], "calls": backing.allocation.calls}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    engine.shutdown_resources()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both ranks' results, scenario by scenario."""
    out = tmp_path_factory.mktemp("resize_ranks")
    context = mp.start_processes(_resize_on_rank, args=(rank_worker.free_port(), str(out)), nprocs=2, join=False,
                                 start_method="fork")
    try:
        while not context.join(timeout=120):
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_rank_with_live_tokens_in_the_tail_stops_every_rank_before_any_shrinks(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["live_tokens_in_tail"] for r in ranks)
    assert rank0["error"] == rank1["error"]  # the same typed error on both
    kind, message = rank0["error"]
    assert kind == "LiveTokensInTailError" and message.startswith("rank 1 (tp 1/2, pp 0/1): ")
    assert "KV tokens in use lie past token" in message
    for rank in (rank0, rank1):
        assert "keep_only" not in rank["calls"]  # no rank was asked to release a byte
        assert rank["free"][0] == rank["free"][1] and rank["pool_size"][0] == rank["pool_size"][1]


def test_a_rank_that_fails_to_release_makes_every_rank_map_back_and_keep_its_allocator(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = (r["release_fails"] for r in ranks)
    assert rank0["error"] == rank1["error"]
    kind, message = rank0["error"]
    assert kind == "VmmError" and message.startswith("rank 1 (tp 1/2, pp 0/1): cuMemCreate failed")
    assert rank0["calls"] == ["keep_only", "map_within"]  # rank 0 released, then mapped it back
    for rank in (rank0, rank1):
        assert rank["free"][0] == rank["free"][1] and rank["pool_size"][0] == rank["pool_size"][1]
