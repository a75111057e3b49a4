"""On a CUDA device: is the headroom a bootstrap promises really free, and does a dry run promise too much?

For each case a fresh process (a fresh CUDA context, as a real engine has) bootstraps
through the EngineContainer with dummy weights and the default mem_fraction_static, and
records, phase by phase:

- the plan's bytes against torch.cuda.memory_allocated's growth (weights and KV cache);
- cudaMemGetInfo's free bytes after the bootstrap against the promised headroom
  `round(free_before_load * (1 - mem_fraction_static))`: slack = free - promise;
- how much free memory the CUDA context took while weights loaded and while the KV cache
  was built, beyond the arenas themselves (kernels loading into the context);
- the tokens of a dry run (meta device, the named card) against the real tokens.

    python benchmarks/gpu_headroom.py [--card H200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES: list[tuple[str, dict[str, Any]]] = [
    ("Llama-3.1-8B-Instruct", {}),
    ("Llama-3.1-8B-Instruct", {"kv_cache_dtype": "fp8_e4m3", "page_size": 16}),
    ("Llama-3.1-8B-Instruct", {"speculative_algorithm": "EAGLE3", "speculative_draft_model": "EAGLE3-LLaMA3.1-Instruct-8B"}),
    ("Qwen3-8B", {}),
    ("Mistral-7B-v0.1", {}),
    ("gemma-2-9b-it", {}),
    ("gpt-oss-20b", {"page_size": 16}),
    ("DeepSeek-V2-Lite", {"page_size": 64}),
    ("Nemotron-H-56B-Base-8K", {}),
    ("SmolLM2-135M", {}),
]


def one_case(model: str, extra: dict[str, Any], card_name: str, device_kind: str = "cuda") -> dict[str, Any]:
    """Bootstrap one case on CUDA (this process's first CUDA work), then its dry run on meta. `device_kind` meta
    bootstraps the first part on the meta device too, the named card's (CI's smoke test, torch.cuda faked)."""
    import torch

    from containers import EngineContainer
    from kvcache.inputs.cards import card_named
    from kvcache.models.presets import load_model_config
    from kvcache.inputs.server_args import ServerArgs

    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device(device_kind)
    free_at_context, total = (int(x) for x in torch.cuda.mem_get_info(device))
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": device_kind, **extra}),
                             model_config=load_model_config(model),
                             **({"card": card_named(card_name)} if device_kind == "meta" else {}))
    runtime = engine.engine()
    allocated0 = torch.cuda.memory_allocated(device)
    for worker in runtime.workers:
        worker.load_weights()
    allocated1 = torch.cuda.memory_allocated(device)
    for worker in runtime.workers:
        worker.init_memory_pool()
    torch.cuda.synchronize(device)
    allocated2 = torch.cuda.memory_allocated(device)
    torch.cuda.empty_cache()
    free_final = int(torch.cuda.mem_get_info(device)[0])
    plan = runtime.target.memory_pool_config
    budget = plan.budget
    weights = sum(w.weights.total_bytes for w in runtime.workers)
    arenas = sum(w.kv_cache.allocated_bytes for w in runtime.workers)
    keep_free = budget.free_after_load_bytes - budget.budget_bytes  # round(free_before * (1 - fraction))
    real = dict(
        tokens=plan.max_total_num_tokens, budget=budget.budget_bytes, fraction=budget.mem_fraction_static,
        free_at_context=free_at_context, free_before_load=budget.free_before_load_bytes,
        free_after_load=budget.free_after_load_bytes, weights_bytes=weights, weights_allocated=allocated1 - allocated0,
        planned_bytes=plan.total_bytes, kv_arena_bytes=arenas, kv_allocated=allocated2 - allocated1,
        free_final=free_final, promised_free=keep_free, slack=free_final - keep_free,
        plan_slack=budget.budget_bytes - plan.total_bytes,
        load_context_growth=budget.free_before_load_bytes - weights - budget.free_after_load_bytes,
        build_context_growth=budget.free_after_load_bytes - arenas - free_final,
    )
    engine.shutdown_resources()
    card = card_named(card_name)
    dry_engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "meta", **extra}),
                                 model_config=load_model_config(model), card=card)
    dry = dry_engine.engine()
    dry.bootstrap()
    dry_plan = dry.target.memory_pool_config
    return dict(model=model, args=extra, total_bytes=total, card_total_bytes=card.total_bytes,
                card_free_before_load=card.free_bytes, torch=torch.__version__, **real,
                dry_tokens=dry_plan.max_total_num_tokens, dry_budget=dry_plan.budget.budget_bytes,
                dry_free_after_load=dry_plan.budget.free_after_load_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--card", default="H200")
    parser.add_argument("--device", default="cuda", choices=["cuda", "meta"], help=argparse.SUPPRESS)  # meta: CI
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: run case N, print JSON
    ns = parser.parse_args(argv)
    if ns.one is not None:
        model, extra = CASES[ns.one]
        print(json.dumps(one_case(model, extra, ns.card, ns.device)))
        return
    rows = []
    for i, (model, extra) in enumerate(CASES):
        done = subprocess.run([sys.executable, __file__, "--one", str(i), "--card", ns.card],
                              capture_output=True, text=True, timeout=120)
        if done.returncode:
            rows.append(dict(model=model, args=extra, error=(done.stderr.strip().splitlines() or ["?"])[-1]))
        else:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("| model | args | weights B (allocated growth) | plan B (allocated growth) | free after - promise (slack) "
          "| budget - plan | context growth: load / build | dry-run tokens | real tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['args']} | error: {r['error']} |")
            continue
        print(f"| {r['model']} | {r['args'] or ''} | {r['weights_bytes']:,} ({r['weights_allocated']:,}) | "
              f"{r['planned_bytes']:,} ({r['kv_allocated']:,}) | {r['slack']:,} | {r['plan_slack']:,} | "
              f"{r['load_context_growth']:,} / {r['build_context_growth']:,} | {r['dry_tokens']:,} | {r['tokens']:,} |")
    if ns.json:
        ns.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
