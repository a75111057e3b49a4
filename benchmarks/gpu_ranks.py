"""Several ranks, one GPU each: do the ranks agree, and does each rank allocate what it planned?

Run under torchrun, one process per GPU (NCCL for the default group; the ranks agree over
a gloo group the engine makes):

    torchrun --nproc-per-node 2 benchmarks/gpu_ranks.py --out OUT_DIR
    torchrun --nproc-per-node 2 benchmarks/gpu_ranks.py --device cpu --smoke --out OUT_DIR   # gloo, CPU

This script owns the default process group; each case bootstraps an EngineContainer inside
it (the engine makes and destroys only its subgroups) and records, on every rank:
- torch.cuda.memory_allocated's growth over the bootstrap against weights + KV arenas;
- the tokens every rank holds (they must be one number) and each rank's bytes per token;
- cudaMemGetInfo's free bytes after the bootstrap against the promised headroom
  (free after load - budget, i.e. round(free_before_load * (1 - fraction)) of the ranks' MIN);
- the forced imbalance: rank 1 holds an extra buffer before the bootstrap, and every rank
  must stop with UnbalancedMemoryError.
Each rank writes `rank<N>.json` into --out; rank 0 prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

GPU_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("llama-tp2", "Llama-3.1-8B-Instruct", {"tp_size": 2}),
    ("llama-pp2", "Llama-3.1-8B-Instruct", {"pp_size": 2}),
    ("qwen3next-tp2", "Qwen3-Next-80B-A3B-Thinking", {"tp_size": 2}),
    ("llama-tp2-imbalance", "Llama-3.1-8B-Instruct", {"tp_size": 2}),
]
SMOKE_MODEL, SMOKE_ARGS = "Llama-3.2-1B-Instruct", {"context_length": 8192}


def _free(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(device)[0])


def _allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def one_case(name: str, model: str, extra: dict[str, Any], device_kind: str) -> dict[str, Any]:
    """Bootstrap one case on this rank; the imbalance case holds an extra buffer on rank 1 first."""
    from containers import EngineContainer
    from kvcache.errors import KVCacheError
    from kvcache.models.presets import load_model_config
    from kvcache.inputs.server_args import ServerArgs

    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": device_kind, **extra}),
                             model_config=load_model_config(model))
    extra_buffer = None
    row: dict[str, Any] = dict(case=name, model=model, args=extra, rank=dist.get_rank())
    try:
        runtime = engine.engine()
        device = runtime.target.device
        if name.endswith("imbalance") and dist.get_rank() == 1:  # a fifth of the memory taken "by another process"
            extra_buffer = torch.ones(runtime.target.memory_probe.total_bytes() // 5 // 4, dtype=torch.float32, device=device)
        allocated0 = _allocated(device)
        try:
            runtime.bootstrap()
        except KVCacheError as exc:
            return {**row, "error_type": type(exc).__name__, "error": str(exc).splitlines()[0]}
        target = runtime.target
        plan = target.memory_pool_config
        budget = plan.budget
        free_final = _free(device)
        weights = sum(w.weights.total_bytes for w in runtime.workers if w.weights is not None)
        arenas = sum(w.kv_cache.allocated_bytes for w in runtime.workers)
        promised = budget.free_after_load_bytes - budget.budget_bytes
        layers = target.parallel_state.layer_range(target.model_config.num_hidden_layers)
        return {**row, "tokens": plan.max_total_num_tokens, "bytes_per_token": plan.bytes_per_token,
                "layers": [layers.start, layers.stop],
                "weights_bytes": weights, "planned_kv_bytes": plan.total_bytes, "kv_arena_bytes": arenas,
                "allocated_growth": _allocated(device) - allocated0, "free_final": free_final,
                "promised_free": promised, "slack": free_final - promised if device.type == "cuda" else None,
                "free_before_load_this_rank": target.pre_model_load_memory,
                "free_before_load_min": budget.free_before_load_bytes}
    finally:
        engine.shutdown_resources()
        del extra_buffer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_MODEL} for every case (a CPU check of the script)")
    parser.add_argument("--out", type=Path, default=Path("."))
    ns = parser.parse_args(argv)
    if ns.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # torchrun's: one GPU per process
    dist.init_process_group("nccl" if ns.device == "cuda" else "gloo")
    rank = dist.get_rank()
    rows = []
    for name, model, extra in GPU_CASES:
        if ns.smoke:
            model, extra = SMOKE_MODEL, {**extra, **SMOKE_ARGS}
        rows.append(one_case(name, model, extra, ns.device))
        print(json.dumps(rows[-1]), flush=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / f"rank{rank}.json").write_text(json.dumps(rows, indent=2))
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    dist.destroy_process_group()
    if rank == 0:
        _print_table(gathered)


def _print_table(by_rank: list[list[dict[str, Any]]]) -> None:
    print("| case | rank | layers | B/token | tokens | weights + KV planned B | memory_allocated growth B "
          "| free after - promised B | error |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for case_rows in zip(*by_rank):
        for r in case_rows:
            if "error" in r:
                print(f"| {r['case']} | {r['rank']} | | | | | | | {r['error_type']}: {r['error'][:120]} |")
                continue
            print(f"| {r['case']} | {r['rank']} | {r['layers'][0]}-{r['layers'][1] - 1} | {r['bytes_per_token']:,} "
                  f"| {r['tokens']:,} | {r['weights_bytes'] + r['planned_kv_bytes']:,} | {r['allocated_growth']:,} "
                  f"| {r['slack'] if r['slack'] is not None else '-'} | |")


if __name__ == "__main__":
    main()
