"""On a CUDA device: do the pools allocate exactly the plan's bytes, and how fast do they build?

For each case it builds the KV cache through the container's configurator with a
fixed --kv-cache-memory budget (no weights needed), and records
torch.cuda.memory_allocated() before and after, the plan's bytes, the build time,
and the card's memset bandwidth (zero_ on a large buffer) for comparison: building
zero-initialised pools is a memset, so build time ~ bytes / bandwidth is the floor.

    python benchmarks/gpu_pool_build.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from containers import EngineContainer  # noqa: E402
from kvcache.byte_units import GiB  # noqa: E402
from kvcache.inputs.cards import card_named  # noqa: E402
from kvcache.models.presets import load_model_config  # noqa: E402
from kvcache.inputs.server_args import ServerArgs  # noqa: E402

CASES = [
    ("Llama-3.1-8B-Instruct", dict(kv_cache_dtype="auto", page_size=1)),
    ("Llama-3.1-8B-Instruct", dict(kv_cache_dtype="fp8_e4m3", page_size=16)),
    ("DeepSeek-V3", dict(kv_cache_dtype="auto", page_size=64)),
    ("DeepSeek-V2-Lite", dict(kv_cache_dtype="auto", page_size=1)),
    ("gpt-oss-20b", dict(kv_cache_dtype="auto", page_size=1)),
    ("Qwen3-Next-80B-A3B-Thinking", dict(kv_cache_dtype="auto", page_size=1)),
]


def memset_bandwidth(device: torch.device, nbytes: int = 8 * GiB, repeat: int = 5) -> float:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    buf.zero_()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        buf.zero_()
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / repeat
    del buf
    torch.cuda.empty_cache()
    return nbytes / seconds


def build_case(model: str, extra: dict, budget: int, device_kind: str = "cuda") -> dict:
    """One case's pools built with a fixed KV budget; on the meta device (CI's smoke test) on an H200's numbers."""
    args = ServerArgs.from_mapping(dict(device=device_kind, kv_cache_memory=budget, **extra))
    container = EngineContainer(server_args=args, model_config=load_model_config(model),
                                **({"card": card_named("H200")} if device_kind == "meta" else {}))
    configurator = container.target.configurator()
    device = configurator.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    free_before = container.memory_probe().free_bytes()
    start = time.perf_counter()
    result = configurator.configure(pre_model_load_memory=free_before)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    grown = torch.cuda.memory_allocated(device) - before
    plan = result.memory_pool_config
    row = dict(
        model=model, **extra, budget_bytes=budget, planned_bytes=plan.total_bytes, allocated_delta=grown,
        exact=grown == plan.total_bytes, reported_allocated=result.allocated_bytes,
        tokens=plan.max_total_num_tokens, requests=plan.max_running_requests, build_s=seconds,
        buffers=plan.buffers,
    )
    del result, configurator
    container.shutdown_resources()
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--budget-gib", type=int, default=40)
    parser.add_argument("--memset-gib", type=int, default=8)
    parser.add_argument("--device", default="cuda", choices=["cuda", "meta"], help=argparse.SUPPRESS)  # meta: CI
    ns = parser.parse_args(argv)
    device = torch.device("cuda", 0) if ns.device == "cuda" else torch.device(ns.device)
    torch.cuda.init()
    torch.zeros(1, device=device)
    free, total = torch.cuda.mem_get_info(device)
    context = dict(device=torch.cuda.get_device_name(device), total_bytes=total, free_after_context_bytes=free,
                   context_bytes=total - free, torch=torch.__version__)
    bandwidth = memset_bandwidth(device, ns.memset_gib * GiB)
    rows = [build_case(model, extra, ns.budget_gib * GiB, ns.device) for model, extra in CASES]
    print(json.dumps(context))
    print(f"memset bandwidth: {bandwidth / 1e9:.0f} GB/s")
    print("| model | kv dtype | page | planned bytes | memory_allocated delta | exact | build ms | memset floor ms |")
    print("|---|---|---|---:|---:|---|---:|---:|")
    for r in rows:
        floor_ms = r["planned_bytes"] / bandwidth * 1000
        print(f"| {r['model']} | {r['kv_cache_dtype']} | {r['page_size']} | {r['planned_bytes']:,} | "
              f"{r['allocated_delta']:,} | {r['exact']} | {r['build_s'] * 1000:.1f} | {floor_ms:.1f} |")
    if ns.json:
        ns.json.write_text(json.dumps(dict(context=context, memset_bytes_per_s=bandwidth, cases=rows), indent=2))


if __name__ == "__main__":
    main()
