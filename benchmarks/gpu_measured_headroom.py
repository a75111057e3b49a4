"""On a CUDA device: measured headroom (--kv-headroom) against SGLang's static plan, each in a fresh process.

Per model, three child processes (a fresh CUDA context each, as a real engine has):
- `measured`: Engine.bootstrap() at the defaults (the switch's auto is on), then free memory by
  cudaMemGetInfo from outside the project's accounting, then N alternating worst-case prefill
  chunks and max-batch decode steps through the pools (decode replays a graph when one holds the
  batch), in turn with the model's other worst-case steps (MLA's chunked context; the mixed chunk with
  --mixed-chunk), recording the lowest free memory during any step (cudaMemGetInfo before the steps less
  the caching allocator's peak reserved growth) and after each one;
- `static`: the same bootstrap with --kv-headroom fraction (SGLang 0.5.23's plan);
- `dry`: `plan --gpu CARD` on the meta device.

    python benchmarks/gpu_measured_headroom.py --out DIR [--models ...] [--steps 200] [--mixed-chunk]

--mixed-chunk runs every engine (measured, static, dry) with SGLang's --enable-mixed-chunk.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ["Llama-3.1-8B-Instruct", "Qwen3-8B", "DeepSeek-V2-Lite"]


def free_now(torch: Any) -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


OUTSIDE_READING = (
    "import json, torch, pynvml\n"
    "pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); nvml = pynvml.nvmlDeviceGetMemoryInfo(h)\n"
    "free, total = torch.cuda.mem_get_info()\n"
    "print(json.dumps(dict(nvml_free=int(nvml.free), nvml_total=int(nvml.total), cuda_free=int(free), cuda_total=int(total))))\n")


def outside_reading() -> dict[str, Any]:
    """Free memory as another process sees it while this one holds its pools: NVML first (no CUDA context), then
    cudaMemGetInfo in that fresh process (after its own context is made, as an engine's second process would)."""
    done = subprocess.run([sys.executable, "-c", OUTSIDE_READING], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def engine_for(model: Any, settings: dict[str, Any]) -> Any:
    """An EngineContainer on CUDA for a preset name (or a ModelConfig, as the CI smoke test passes) with these
    server args on top (the smoke test's: the CPU, a small card)."""
    from containers import EngineContainer
    from kvcache.inputs.server_args import ServerArgs
    from kvcache.models.presets import load_model_config

    config = load_model_config(model) if isinstance(model, str) else model
    return EngineContainer(server_args=ServerArgs.from_mapping({"device": "cuda", **settings}), model_config=config)


def measured(model: Any, steps: int, mixed_chunk: bool = False, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from app.report import build_report

    total = int(torch.cuda.mem_get_info()[1])
    engine = engine_for(model, {**(settings or {}), "enable_mixed_chunk": mixed_chunk})
    runtime = engine.engine()
    t0 = time.perf_counter()
    runtime.bootstrap()
    out: dict[str, Any] = {"bootstrap_s": time.perf_counter() - t0}
    runner = runtime.target
    report = build_report(runtime, rules=engine.engine_rules())
    gc.collect()
    torch.cuda.empty_cache()
    out.update(free_after_load=report.free_after_load_bytes, free_before_load=report.free_before_load_bytes,
               planned_bytes=report.planned_bytes, weights_bytes=report.weights_bytes,
               kept_free=report.free_after_load_bytes - report.planned_bytes)
    out.update(tokens=runner.max_total_num_tokens, max_running_requests=runner.max_running_requests,
               free_after_bootstrap=free_now(torch), total=total, measured_headroom=report.measured_headroom,
               timings=dict(runner.timings), graphs=len(runner.graph_capture.batch_sizes) if runner.graph_capture else 0,
               graph_max_bs=runner.graph_capture.max_bs if runner.graph_capture else 0)
    out["outside_after_bootstrap"] = outside_reading()
    m = runner.measured_sizing
    if m is None:
        return out
    from app.forward.worst_case import sample_with_logprobs
    from kvcache.sizing.runtime_reserve import default_chunked_prefill_size

    chunk = runner.sizing.settings.chunked_prefill_size or default_chunked_prefill_size(
        runner.memory_probe.device_capacity_bytes())  # as the engine's step, which reads nvidia-smi's card
    bs = runner.max_running_requests
    step = runner._worst_case_step_factory(runner=runner, chunked_prefill_size=chunk, decode_batch=bs,
                                           largest_graph_batch=runner.graph_capture.max_bs if runner.graph_capture else 0,
                                           mixed_chunk=mixed_chunk)
    cycle = ["prefill_chunk", "decode", *(n for n in step.names() if n in ("mixed_chunk", "mla_context"))]
    requests = runner.decode_requests()
    vocab = runner.model_config.vocab_size
    free_start = free_now(torch)
    reserved_start = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    lowest_after, series, t1 = free_start, [], time.perf_counter()
    for i in range(steps):
        name = cycle[i % len(cycle)]
        if name != "decode":  # a worst-case step (app.forward.worst_case): the chunk with prompt logprobs, ...
            step.run(name)
        else:  # the largest decode batch, a graph replayed where one holds it, sampled with logprobs
            rows = requests.add(bs)
            sample_with_logprobs(runner.decode(requests.step(rows, torch.randint(0, vocab, (bs,), device=runner.device))))
            requests.release(rows)
        f = free_now(torch)
        lowest_after = min(lowest_after, f)
        if i in (0, 1, 9, 99, steps - 1):
            series.append((i + 1, f, torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()))
    peak_growth = torch.cuda.max_memory_reserved() - reserved_start
    out.update(steps=steps, cycle=cycle, chunk=chunk, decode_bs=bs, steps_s=time.perf_counter() - t1, free_start=free_start,
               lowest_free_during=free_start - peak_growth, lowest_free_after_step=lowest_after,
               series=series, margin=m.margin_bytes,
               margin_kept=free_start - peak_growth >= m.margin_bytes,
               idle_fraction_of_card=(free_start - peak_growth) / total)
    out["outside_after_steps"] = outside_reading()
    return out


def static(model: Any, mixed_chunk: bool = False, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    engine = engine_for(model, {**(settings or {}), "kv_headroom": "fraction", "enable_mixed_chunk": mixed_chunk})
    runtime = engine.engine()
    runtime.bootstrap()
    plan = runtime.target.memory_pool_config
    runtime.target.capture_decode_graphs()
    gc.collect()
    torch.cuda.empty_cache()
    return dict(tokens=plan.max_total_num_tokens, fraction=plan.budget.mem_fraction_static,
                free_before_load=plan.budget.free_before_load_bytes, free_after_load=plan.budget.free_after_load_bytes,
                max_running_requests=plan.max_running_requests, free_after_capture=free_now(torch),
                graph_bytes=runtime.target.graph_capture.bytes_taken, torch=torch.__version__,
                device=torch.cuda.get_device_name())


def dry(model: str, card: str, mixed_chunk: bool = False) -> dict[str, Any]:
    import io
    from contextlib import redirect_stdout

    from app.cli import main as cli_main

    buf = io.StringIO()
    with redirect_stdout(buf):
        code = cli_main(["plan", "--model", model, "--gpu", card, "--json", *["--enable-mixed-chunk"] * mixed_chunk])
    data = json.loads(buf.getvalue())
    # tokens: the dry run's headline (the measured bootstrap's prediction where the card measures); static_tokens:
    # SGLang's static plan beside it
    return dict(exit=code, tokens=data.get("max_total_num_tokens"), source=data.get("max_total_num_tokens_source"),
                static_tokens=data.get("static_plan_tokens"), measured_headroom=data.get("measured_headroom"),
                prediction=data.get("measured_prediction"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--card", default="H200")
    parser.add_argument("--mixed-chunk", action="store_true")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child: KIND MODEL
    ns = parser.parse_args(argv)
    if ns.one:
        kind, model = ns.one
        try:
            result = {"measured": lambda: measured(model, ns.steps, ns.mixed_chunk),
                      "static": lambda: static(model, ns.mixed_chunk), "dry": lambda: dry(model, ns.card, ns.mixed_chunk)}[kind]()
        except Exception:  # noqa: BLE001 - the parent records it and goes on
            result = {"error": traceback.format_exc()[-4000:]}
        print("RESULT " + json.dumps(result, default=str))
        return
    rows: dict[str, Any] = {}
    for model in ns.models:
        for kind in ("static", "measured", "dry"):
            done = subprocess.run([sys.executable, __file__, "--one", kind, model, "--steps", str(ns.steps),
                                   "--card", ns.card, *["--mixed-chunk"] * ns.mixed_chunk],
                                  capture_output=True, text=True, timeout=240)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            rows[f"{model}:{kind}"] = (json.loads(lines[-1][7:]) if lines else
                                       {"error": done.stderr[-4000:], "rc": done.returncode})
            print(model, kind, json.dumps(rows[f"{model}:{kind}"], default=str)[:2500], flush=True)
            if ns.out:
                ns.out.mkdir(parents=True, exist_ok=True)
                (ns.out / "measured_headroom.json").write_text(json.dumps(rows, indent=1, default=str))
        s, m = rows[f"{model}:static"], rows[f"{model}:measured"]
        if "tokens" in s and "tokens" in m:
            print(model, "measured / static tokens =", m["tokens"] / s["tokens"], flush=True)


if __name__ == "__main__":
    main()
