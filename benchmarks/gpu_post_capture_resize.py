"""One GPU run for issue 11: the Triton decode kernel, VMM storage, CUDA-graph capture and the post-capture resize.

    python benchmarks/gpu_post_capture_resize.py --out DIR [--models Llama-3.1-8B-Instruct DeepSeek-V2-Lite]

Per model, two real bootstraps on this card with --cuda-graph-max-bs 256 and
--max-running-requests 256: SGLang's static plan (graphs captured after it, to see the
headroom left), then the resizable plan (higher fraction, VMM pools): eager decode of two
request groups, graph capture, graph replay vs eager, the resize, replay after it vs before,
and 1,000 replayed decode steps watching free memory. Writes DIR/post_capture.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from containers import EngineContainer  # noqa: E402
from kvcache.models.presets import load_model_config  # noqa: E402
from kvcache.inputs.server_args import ServerArgs  # noqa: E402

GIB = 1 << 30


def free_now() -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def smoke(device: str = "cuda", memory: Any = None, unit: int = 1 << 20) -> dict[str, Any]:
    """The kernel against the torch reference on random pools (CUDA only), and a VMM allocation of 256 units
    (MiB) released in part (`memory`: the driver, CUDA's unless a fake is given)."""
    from kvcache.memory.vmm_storage import VmmAllocation

    out: dict[str, Any] = {}
    if device == "cuda":
        out.update(kernel_vs_reference())
    before = free_now()
    alloc = VmmAllocation(256 * unit, torch.device(device), chunk_bytes=64 * unit, memory=memory)
    mapped = before - free_now()
    view = alloc.view(0, 256 * unit)
    view.copy_(torch.arange(256 * unit, device=device, dtype=torch.int64).remainder(251).to(torch.uint8))
    keep = [(0, 70 * unit), (128 * unit, 131 * unit + 5)]
    expected = [view[s:e].clone() for s, e in keep]
    released = alloc.keep_only(keep)
    same = all(bool(torch.equal(alloc.view(s, e - s), x)) for (s, e), x in zip(keep, expected))
    out.update(vmm_granularity=alloc.granularity, vmm_mapped_delta=mapped, vmm_released=released,
               vmm_kept_bytes_intact=same,
               vmm_blocks_after=[(b.offset, b.size) for b in alloc.blocks])
    del view, alloc
    gc.collect()
    torch.cuda.empty_cache()
    out["vmm_free_after_close_vs_before"] = free_now() - before
    return out


def kernel_vs_reference() -> dict[str, float]:
    """The Triton decode kernel against the torch reference on random CUDA pools: the largest difference per case."""
    from app.forward.paged_attention import paged_decode_attention_torch
    from app.forward.triton_decode import paged_decode_attention_triton

    out: dict[str, float] = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, heads, kvh, dk, dv, fp8, mla in [("gqa_bf16", 32, 8, 128, 128, False, False),
                                               ("gqa_fp8", 32, 8, 128, 128, True, False),
                                               ("mla_bf16", 16, 1, 576, 512, False, True)]:
        rows = 4096
        k = torch.randn(rows, kvh, dk, device="cuda", generator=g, dtype=torch.bfloat16)
        v = k[..., :dv] if mla else torch.randn(rows, kvh, dv, device="cuda", generator=g, dtype=torch.bfloat16)
        if fp8:
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        table = torch.randint(1, rows, (9, 1000), device="cuda", dtype=torch.int32, generator=g)
        rows_idx = torch.arange(1, 9, device="cuda")
        seq = torch.tensor([1, 15, 16, 17, 100, 513, 999, 1000], device="cuda", dtype=torch.int32)
        q = torch.randn(8, heads, dk, device="cuda", generator=g, dtype=torch.bfloat16)
        a = paged_decode_attention_triton(q, k, v, table, rows_idx, seq, dk ** -0.5).float()
        b = paged_decode_attention_torch(q.float(), k, v, table, rows_idx, seq, dk ** -0.5).float()
        out[f"kernel_{name}_max_abs_diff"] = float((a - b).abs().max())
    return out


def engine_for(model: Any, settings: dict[str, Any]) -> EngineContainer:
    """An EngineContainer for a preset name (or a ModelConfig, as the CI smoke test passes) with these server args."""
    config = load_model_config(model) if isinstance(model, str) else model
    return EngineContainer(server_args=ServerArgs.from_mapping(settings), model_config=config)


def bootstrap(model: Any, settings: dict[str, Any] | None = None, **args: Any) -> tuple[EngineContainer, Any]:
    """Weights and pools on CUDA with graphs up to bs 256 (`settings` on top: the smoke test's CPU and small card)."""
    engine = engine_for(model, {"device": "cuda", "cuda_graph_max_bs": 256, "max_running_requests": 256,
                                **(settings or {}), **args})
    runner = engine.engine().target
    runner.load_weights()  # the phases one by one: Engine.bootstrap would capture and resize by itself
    runner.init_memory_pool()
    return engine, runner


def release(engine: EngineContainer) -> None:
    engine.shutdown_resources()
    engine.reset_singletons()
    gc.collect()
    torch.cuda.empty_cache()


def static_run(model: Any, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    engine, runner = bootstrap(model, settings)
    plan = runner.memory_pool_config
    capture = runner.capture_decode_graphs()
    out = dict(fraction=plan.budget.mem_fraction_static, tokens=plan.max_total_num_tokens,
               pre_model_load=runner.pre_model_load_memory, kv_total_bytes=plan.total_bytes,
               capture_bytes=capture.bytes_taken, capture_s=capture.seconds, graphs=len(capture.batch_sizes),
               free_after_capture=capture.free_after_bytes,
               promised_headroom=plan.budget.free_after_load_bytes - plan.budget.budget_bytes)  # the budget's keep-free
    del runner
    release(engine)
    return out


def resized_run(model: Any, steps: int, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine, runner = bootstrap(model, settings, enable_post_capture_kv_resize=True)
    out: dict[str, Any] = dict(bootstrap_s=time.perf_counter() - t0, timings=dict(runner.timings))
    plan = runner.memory_pool_config
    out.update(fraction=plan.budget.mem_fraction_static, tokens_before=plan.max_total_num_tokens,
               kv_total_before=plan.total_bytes, vmm_allocations=len(runner._vmm_backing.allocations))
    requests = runner.decode_requests()
    vocab = runner.model_config.vocab_size
    g = torch.Generator(device=runner.device).manual_seed(0)
    groups = {bs: requests.add(bs) for bs in (64, 13)}
    for _ in range(24):  # some history in the pools, eagerly
        for rows in groups.values():
            runner.forward_decode(requests.step(rows, torch.randint(0, vocab, (len(rows),), device=runner.device, generator=g)))
    batches = {bs: requests.step(rows, torch.randint(0, vocab, (len(rows),), device=runner.device, generator=g))
               for bs, rows in groups.items()}
    eager = {bs: runner.forward_decode(b).clone() for bs, b in batches.items()}
    capture = runner.capture_decode_graphs()
    out.update(capture_bytes=capture.bytes_taken, capture_s=capture.seconds, graphs=len(capture.batch_sizes),
               free_after_capture=capture.free_after_bytes)
    replay = {bs: runner.decode_graphs.replay(b).clone() for bs, b in batches.items()}
    for bs in batches:
        out[f"graph_vs_eager_bs{bs}_equal"] = bool(torch.equal(replay[bs], eager[bs]))
        out[f"graph_vs_eager_bs{bs}_max_abs_diff"] = float((replay[bs] - eager[bs]).abs().max())
    del requests  # a scheduler holding the old allocator would keep its index allocated
    resize = runner.post_capture_resize_kv_pool()
    free_after_resize = runner.memory_probe.free_bytes()
    out.update(tokens_after=resize.tokens_after, headroom=resize.headroom_bytes,
               measured_free_before_resize=resize.free_after_capture_bytes, released_planned=resize.released_bytes,
               free_after_resize=free_after_resize, headroom_kept=free_after_resize >= resize.headroom_bytes,
               resize_s=runner.timings.get("post_capture_resize_s"), kv_total_after=resize.after.total_bytes)
    again = {bs: runner.decode_graphs.replay(b).clone() for bs, b in batches.items()}
    for bs in batches:
        out[f"replay_after_resize_bs{bs}_equal"] = bool(torch.equal(again[bs], replay[bs]))
    # 1,000 replayed decode steps of 64 new requests on the resized pools
    requests = runner.decode_requests()
    rows = requests.add(64)
    ids = torch.randint(0, vocab, (64,), device=runner.device, generator=g)
    free_series, t1 = [], time.perf_counter()
    for step in range(steps):
        ids = runner.decode_graphs.replay(requests.step(rows, ids)).argmax(-1)
        if step in (0, 9, 99, steps - 1):
            free_series.append((step + 1, free_now(), torch.cuda.memory_allocated()))
    out.update(replay_steps=steps, replay_s=time.perf_counter() - t1, free_series=free_series,
               free_loss_first_to_last=free_series[0][1] - free_series[-1][1])
    del runner, requests
    release(engine)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["Llama-3.1-8B-Instruct", "DeepSeek-V2-Lite"])
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                              "total_bytes": int(torch.cuda.mem_get_info()[1])}

    def record(key: str, fn: Any) -> None:
        start = time.perf_counter()
        try:
            result[key] = fn()
        except Exception:  # noqa: BLE001 - one phase failing must not hide the others
            result[key] = {"error": traceback.format_exc()[-3000:]}
        result[key + "_wall_s"] = time.perf_counter() - start
        gc.collect()
        torch.cuda.empty_cache()
        result[key + "_free_after"] = free_now()
        print(key, json.dumps(result[key], default=str)[:3000], flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "post_capture.json").write_text(json.dumps(result, indent=1, default=str))

    record("smoke", smoke)
    for model in args.models:
        record(f"{model}:static", lambda: static_run(model))
        record(f"{model}:resized", lambda: resized_run(model, args.steps))
        static, resized = result[f"{model}:static"], result[f"{model}:resized"]
        if "tokens" in static and "tokens_after" in resized:
            print(model, "tokens after resize / static plan =", resized["tokens_after"] / static["tokens"], flush=True)


if __name__ == "__main__":
    main()
