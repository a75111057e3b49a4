"""Every script in benchmarks/ runs here in a smoke form, so a changed signature fails CI rather than the next GPU run.

Each runs in this process at its smallest settings: on the CPU or the meta device, and where it needs CUDA with
the device stood in for (kvcache.testing: FakeCudaReadings for torch.cuda's memory readings, the fake VMM driver
for the resizable pools, graph capture replaced by eager decoding). The numbers are not the point (a simulated
card answers them); that each function runs, with the arguments it is called with, and returns its fields, is.
Scripts that run the reference engines' own code skip without KVCACHE_REFERENCE_SRC, as the reference tests do.
How each is run for real (command, device, time): README, "Benchmarks".
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import tempfile
from pathlib import Path
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from reference_sources import reference_src_holding
from test_forward_decode import TINY_MLA

import app.model_runner as model_runner
from app.forward.graphs import GraphCapture
from kvcache.byte_units import GiB
from kvcache.memory.vmm_storage import VmmBacking
from kvcache.models.hf_config import model_config_from_hf
from kvcache.sizing import worker_sizing
from kvcache.memory.memory_probe import FixedMemoryProbe
from kvcache.testing import TINY_MODEL_HF_CONFIG, FakeCudaReadings, tiny_model_config
from kvcache.testing.virtual_memory import FakeVirtualMemory

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CARD = GiB  # the simulated card: SGLang's fraction for it is the 0.05 floor, 40 MiB of pools in CPU memory
SMALL = {"device": "cpu", "memory_limit": CARD, "page_size": 16, "max_running_requests": 8, "cuda_graph_max_bs": 8,
         "chunked_prefill_size": 64}


def bench(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (its own sys.path entry is the repository root, already importable)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class EagerGraphs:
    """Decode graphs stood in for on the CPU: batches up to the largest 'captured' size decode eagerly."""

    def __init__(self, runner: Any, max_bs: int) -> None:
        self.runner, self.max_bs = runner, max_bs

    def holds(self, batch_size: int) -> bool:
        return batch_size <= self.max_bs

    def replay(self, batch: Any) -> torch.Tensor:
        return self.runner.forward_decode(batch)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeCudaReadings:
    """A CUDA worker's start on the CPU: the resize rule read as on CUDA, VMM pools on the fake driver, graph
    capture replaced by eager decoding, torch.cuda's readings from a simulated card of CARD bytes."""
    real = worker_sizing.post_capture_eligibility
    monkeypatch.setattr(worker_sizing, "post_capture_eligibility", lambda **kw: real(**{**kw, "device_type": "cuda"}))
    memory = FakeVirtualMemory(granularity=4096, capacity_bytes=GiB)
    monkeypatch.setattr(model_runner, "VmmBacking", lambda: VmmBacking(chunk_bytes=64 * 4096, memory=lambda d: memory))

    def capture(runner: Any, max_bs: int | None = None) -> GraphCapture:
        limit = runner.decode_graph_max_bs(max_bs)
        free = runner.memory_probe.free_bytes()
        runner.decode_graphs = EagerGraphs(runner, limit) if limit else None
        sizes = tuple(sorted({b for b in (1, 2, 4, 8) if b < limit} | ({limit} if limit else set())))
        runner.graph_capture = GraphCapture(batch_sizes=sizes,
                                            free_before_bytes=free, free_after_bytes=free, seconds=0.0)
        return runner.graph_capture
    monkeypatch.setattr(model_runner.ModelRunner, "capture_decode_graphs", capture)
    readings = FakeCudaReadings(total_bytes=CARD, free_bytes=CARD // 2)
    with readings.installed():
        yield readings


def on_the_card(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str = "engine_for") -> None:
    """The benchmark's engines read the simulated card (a FixedMemoryProbe of CARD bytes), not the host."""
    made = getattr(module, name)

    def engine(*args: Any, **kwargs: Any) -> Any:
        container = made(*args, **kwargs)
        container.memory_probe.override(FixedMemoryProbe(total_bytes=CARD))
        return container
    monkeypatch.setattr(module, name, engine)


def test_gpu_measured_headroom(fake_gpu: FakeCudaReadings, monkeypatch: pytest.MonkeyPatch) -> None:
    b = bench("gpu_measured_headroom")
    monkeypatch.setattr(b, "outside_reading", lambda: {"outside": "not read in CI"})  # a process of its own
    on_the_card(monkeypatch, b)
    for mixed in (False, True):  # the bootstrap measures the mixed chunk when the flag is on, and the run cycles it
        out = b.measured(tiny_model_config(), steps=3, mixed_chunk=mixed, settings=SMALL)
        steps = ["prefill_chunk", "mixed_chunk", "alternating"] if mixed else ["prefill_chunk"]  # 8 requests: graphs
        assert list(out["measured_headroom"]["steps"]) == steps and out["steps"] == 3
        assert out["cycle"] == ["prefill_chunk", "decode", *["mixed_chunk"] * mixed]
    # an MLA model whose context holds SGLang's 8,192-token threshold beyond the 64-token chunk: its context step
    mla = model_config_from_hf({**TINY_MLA, "max_position_embeddings": 8300}, name="tiny-mla")
    out = b.measured(mla, steps=3, settings=SMALL)
    assert list(out["measured_headroom"]["steps"]) == ["prefill_chunk", "mla_context", "alternating"]
    assert out["cycle"] == ["prefill_chunk", "decode", "mla_context"]
    static = b.static(tiny_model_config(), settings=SMALL)
    assert static["tokens"] > 0 and static["device"] == fake_gpu.name


def test_gpu_measured_headroom_dry_run() -> None:
    dry = bench("gpu_measured_headroom").dry("Llama-3.1-8B-Instruct", "H200", mixed_chunk=True)
    assert dry["exit"] == 0 and dry["prediction"]["tokens"] == dry["tokens"]  # on the meta device, as for real


def test_gpu_post_capture_resize(fake_gpu: FakeCudaReadings, monkeypatch: pytest.MonkeyPatch) -> None:
    b = bench("gpu_post_capture_resize")
    on_the_card(monkeypatch, b)
    out = b.smoke("cpu", FakeVirtualMemory(granularity=4096, capacity_bytes=GiB), unit=4096)
    assert out["vmm_kept_bytes_intact"] and out["vmm_released"] > 0
    # 64 + 13 requests, then 64 more after the resize, through graphs up to 160 (no eager reserve: a 1 GiB card
    # has none to give), as for real with 256
    settings = {**SMALL, "max_running_requests": 160, "cuda_graph_max_bs": 160, "mem_fraction_static": 0.1}
    assert b.static_run(tiny_model_config(), settings)["tokens"] > 0
    resized = b.resized_run(tiny_model_config(), 2, settings)
    assert resized["replay_steps"] == 2 and resized["graph_vs_eager_bs13_equal"]


def test_gpu_headroom() -> None:
    """A child's case (the smallest model) on the meta device, torch.cuda read from the simulated card."""
    b = bench("gpu_headroom")
    smallest = next(i for i, (model, extra) in enumerate(b.CASES) if model == "SmolLM2-135M" and not extra)
    out = io.StringIO()
    with FakeCudaReadings(total_bytes=CARD, free_bytes=CARD).installed(), contextlib.redirect_stdout(out):
        b.main(["--one", str(smallest), "--card", "H200", "--device", "meta"])
    row = json.loads(out.getvalue())
    assert row["model"] == "SmolLM2-135M" and row["tokens"] == row["dry_tokens"]  # both on the H200, on meta


def test_gpu_pool_build(capsys: pytest.CaptureFixture[str]) -> None:
    """Every case's pools built on the meta device (an H200's numbers), torch.cuda read from the simulated card."""
    with FakeCudaReadings(total_bytes=CARD, free_bytes=CARD).installed():
        bench("gpu_pool_build").main(["--device", "meta", "--budget-gib", "1", "--memset-gib", "1"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]  # under the header
    assert len(table) == len(bench("gpu_pool_build").CASES)


def test_gpu_op_costs(capsys: pytest.CaptureFixture[str]) -> None:
    """The host-side operations on the CPU, one chunk of one call each (the kernels and pinned copies need CUDA)."""
    with FakeCudaReadings(total_bytes=CARD, free_bytes=CARD).installed():
        bench("gpu_op_costs").main(["--device", "cpu", "--chunk", "1", "--chunks", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.endswith("us  torch.cat((free_list, ids)) (SGLang's free, 500k free)") for line in lines)


def test_gpu_fault_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU walk (the script's own --device cpu), the first hit of each fault point it meets, each row PASS."""
    assert bench("gpu_fault_matrix").main_(["--device", "cpu", "--max-hits", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(" PASS, 0 FAIL on cpu") and not last.startswith("0 ")


def test_gpu_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """One case on one rank of a gloo group in this process (torchrun runs a rank per GPU for real): the tiny
    model from a config.json on a 1 GiB host limit."""
    import torch.distributed as dist

    b = bench("gpu_ranks")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "config.json")
        config.write_text(json.dumps(TINY_MODEL_HF_CONFIG))
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            row = b.one_case("smoke", str(config), {"memory_limit": CARD, "max_running_requests": 8}, "cpu")
        finally:
            dist.destroy_process_group()
    assert row["rank"] == 0 and row["tokens"] > 0 and "error" not in row


def test_bench_plan(capsys: pytest.CaptureFixture[str]) -> None:
    bench("bench_plan").main_bench(["--models", "Llama-3.1-8B-Instruct", "--repeat", "1", "--processes", "0"])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Llama-3.1-8B-Instruct ")]
    assert row.split()[1] == "0"  # the plan's exit code


def test_bench_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """The default sweep once (96 cells), without the plan loop and the processes."""
    bench("bench_fit").main_bench(["--repeat", "0", "--processes", "0", "--skip-plan-loop"])
    assert capsys.readouterr().out.startswith("default sweep, 96 cells: ")


@pytest.fixture
def scripts_beside_reference() -> Iterator[None]:
    """benchmarks/ importable by name (the scripts import each other), and the reference engines' stand-in
    modules they load removed afterwards (compiled libraries stay: they cannot be imported twice)."""
    pytest.importorskip("numpy", reason="SGLang's and vLLM's modules import NumPy, which this project does not install")
    finders, modules, path = list(sys.meta_path), set(sys.modules), list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield
    finally:
        sys.path[:] = path
        sys.meta_path[:] = finders
        for name in set(sys.modules) - modules:
            if name.split(".")[0] not in ("numpy", "triton", "torch"):
                del sys.modules[name]


def test_bench_allocator(scripts_beside_reference: None, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    """Ours, SGLang's and vLLM's allocators on one small pool per workload, 100 steps each (not time-boxed)."""
    root = reference_src_holding("vllm/v1/core/block_pool.py", "vLLM 0.34.0")
    reference_src_holding("sglang/srt/mem_cache/allocator/token.py", "SGLang 0.5.23")
    b = bench("bench_allocator")
    monkeypatch.setattr(b, "TIME_BOX_S", 0.0)
    monkeypatch.setattr(b, "MAX_STEPS", 2 * b.CHUNK)
    b.main(["--reference-src", str(root), "--sizes", "4096", "--page-sizes", "1", "16", "--trials", "1"])
    out = capsys.readouterr().out
    assert out.count("Row(") == 3  # page 1; decode and extend at page 16


def test_vllm_kv_plan(scripts_beside_reference: None, capsys: pytest.CaptureFixture[str]) -> None:
    root = reference_src_holding("vllm/v1/core/kv_cache_planning.py", "vLLM 0.34.0")
    assert bench("vllm_kv_plan").main(["--reference-src", str(root), "--max-model-len", "4096",
                                        "--models", "Meta-Llama-3.1-70B"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Meta-Llama-3.1-70B | ")]
    assert "refuses" not in row


# Where each script in benchmarks/ runs in CI (a test that calls it, its main or its functions); helpers that only
# other scripts import run with those. A new script without a smoke form fails the test below.
SMOKED = {
    "bench_allocator": "test_benchmark_smoke.py::test_bench_allocator",
    "bench_fit": "test_benchmark_smoke.py::test_bench_fit",
    "bench_plan": "test_benchmark_smoke.py::test_bench_plan",
    "gpu_fault_matrix": "test_benchmark_smoke.py::test_gpu_fault_matrix",
    "gpu_headroom": "test_benchmark_smoke.py::test_gpu_headroom",
    "gpu_measured_headroom": "test_benchmark_smoke.py::test_gpu_measured_headroom",
    "gpu_op_costs": "test_benchmark_smoke.py::test_gpu_op_costs",
    "gpu_pool_build": "test_benchmark_smoke.py::test_gpu_pool_build",
    "gpu_post_capture_resize": "test_benchmark_smoke.py::test_gpu_post_capture_resize",
    "gpu_ranks": "test_benchmark_smoke.py::test_gpu_ranks",
    "reference_allocators": "test_benchmark_smoke.py::test_bench_allocator",  # the loader bench_allocator uses
    "reference_tree": "reference_sources.py::reference_src_holding",  # every reference test reads the tree through it
    "sglang_radix_trace": "test_sglang_radix_trace.py::test_sglang_radix_cache_runs_on_our_objects_and_matches_sglangs_allocator",
    "sglang_request_fakes": "test_sglang_radix_trace.py::test_sglang_radix_cache_runs_on_our_objects_and_matches_sglangs_allocator",
    "vllm_kv_plan": "test_benchmark_smoke.py::test_vllm_kv_plan",
    "vllm_steps": "test_bench_vllm_steps.py::test_decode_step_rotates_one_page_per_crossing_without_losing_blocks",
}


def test_every_benchmark_script_has_a_smoke_form_in_ci() -> None:
    scripts = sorted(p.stem for p in BENCHMARKS.glob("*.py"))
    assert scripts == sorted(SMOKED), f"give each script in benchmarks/ a smoke form here: {set(scripts) ^ set(SMOKED)}"
    tests = Path(__file__).resolve().parent
    for script, where in SMOKED.items():
        file, function = where.split("::")
        assert f"def {function}(" in (tests / file).read_text(), f"{script}: {where} is not there"
