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
from reference_sources import benchmarks_importable, reference_src_holding
from test_forward_decode import TINY_MLA

import app.model_runner as model_runner
from app.forward.graphs import GraphCapture
from kvcache.byte_units import GiB
from kvcache.memory.vmm_storage import VmmBacking
from kvcache.models.hf_config import model_config_from_hf
from kvcache.sizing import worker_sizing
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.testing import TINY_MODEL_HF_CONFIG, FakeCudaReadings, tiny_model_config
from kvcache.testing.virtual_memory import FakeVirtualMemory

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CARD = GiB  # the simulated card: SGLang's fraction for it is the 0.05 floor, 40 MiB of pools in CPU memory
SMALL = {"device": "cpu", "memory_limit": CARD, "page_size": 16, "max_running_requests": 8, "cuda_graph_max_bs": 8,
         "chunked_prefill_size": 64}


def bench(path: str) -> ModuleType:
    """A script of benchmarks/ ("benchmarks/<name>.py") as a module (its own sys.path entry is the repository root,
    already importable)."""
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS.parent / path)
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
    b = bench("benchmarks/gpu_measured_headroom.py")
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
    dry = bench("benchmarks/gpu_measured_headroom.py").dry("Llama-3.1-8B-Instruct", "H200", mixed_chunk=True)
    assert dry["exit"] == 0 and dry["prediction"]["tokens"] == dry["tokens"]  # on the meta device, as for real


def test_gpu_post_capture_resize(fake_gpu: FakeCudaReadings, monkeypatch: pytest.MonkeyPatch) -> None:
    b = bench("benchmarks/gpu_post_capture_resize.py")
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
    b = bench("benchmarks/gpu_headroom.py")
    smallest = next(i for i, (model, extra) in enumerate(b.CASES) if model == "SmolLM2-135M" and not extra)
    out = io.StringIO()
    with FakeCudaReadings(total_bytes=CARD, free_bytes=CARD).installed(), contextlib.redirect_stdout(out):
        b.main(["--one", str(smallest), "--card", "H200", "--device", "meta"])
    row = json.loads(out.getvalue())
    assert row["model"] == "SmolLM2-135M" and row["tokens"] == row["dry_tokens"]  # both on the H200, on meta


def test_gpu_pool_build(capsys: pytest.CaptureFixture[str]) -> None:
    """Every case's pools built on the meta device (an H200's numbers), torch.cuda read from the simulated card."""
    with FakeCudaReadings(total_bytes=CARD, free_bytes=CARD).installed():
        bench("benchmarks/gpu_pool_build.py").main(["--device", "meta", "--budget-gib", "1", "--memset-gib", "1"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]  # under the header
    assert len(table) == len(bench("benchmarks/gpu_pool_build.py").CASES)


def test_gpu_op_costs(capsys: pytest.CaptureFixture[str]) -> None:
    """The host-side operations on the CPU, one chunk of one call each (the kernels and pinned copies need CUDA)."""
    with FakeCudaReadings(total_bytes=CARD, free_bytes=CARD).installed():
        bench("benchmarks/gpu_op_costs.py").main(["--device", "cpu", "--chunk", "1", "--chunks", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.endswith("us  torch.cat((free_list, ids)) (SGLang's free, 500k free)") for line in lines)


def test_gpu_fault_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU walk (the script's own --device cpu), the first hit of each fault point it meets, each row PASS."""
    assert bench("benchmarks/gpu_fault_matrix.py").main_(["--device", "cpu", "--max-hits", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(" PASS, 0 FAIL on cpu") and not last.startswith("0 ")


def test_gpu_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """One case on one rank of a gloo group in this process (torchrun runs a rank per GPU for real): the tiny
    model from a config.json on a 1 GiB host limit."""
    import torch.distributed as dist

    b = bench("benchmarks/gpu_ranks.py")
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
    bench("benchmarks/bench_plan.py").main_bench(["--models", "Llama-3.1-8B-Instruct", "--repeat", "1", "--processes", "0"])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Llama-3.1-8B-Instruct ")]
    assert row.split()[1] == "0"  # the plan's exit code


def test_bench_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """The default sweep once (96 cells), without the plan loop and the processes."""
    bench("benchmarks/bench_fit.py").main_bench(["--repeat", "0", "--processes", "0", "--skip-plan-loop"])
    assert capsys.readouterr().out.startswith("default sweep, 96 cells: ")


@pytest.fixture
def scripts_beside_reference() -> Iterator[None]:
    """benchmarks/ importable by name (the scripts import each other), and the reference engines' stand-in
    modules they load removed afterwards (compiled libraries stay: they cannot be imported twice)."""
    pytest.importorskip("numpy", reason="SGLang's and vLLM's modules import NumPy, which this project does not install")
    with benchmarks_importable():
        yield


def test_bench_allocator(scripts_beside_reference: None, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    """Ours, SGLang's and vLLM's allocators on one small pool per workload, 100 steps each (not time-boxed)."""
    root = reference_src_holding("vllm/v1/core/block_pool.py", "vLLM 0.34.0")
    reference_src_holding("sglang/srt/mem_cache/allocator/token.py", "SGLang 0.5.23")
    b = bench("benchmarks/bench_allocator.py")
    monkeypatch.setattr(b, "TIME_BOX_S", 0.0)
    monkeypatch.setattr(b, "MAX_STEPS", 2 * b.CHUNK)
    b.main(["--reference-src", str(root), "--sizes", "4096", "--page-sizes", "1", "16", "--trials", "1"])
    out = capsys.readouterr().out
    assert out.count("Row(") == 3  # page 1; decode and extend at page 16


def test_vllm_kv_plan(scripts_beside_reference: None, capsys: pytest.CaptureFixture[str]) -> None:
    root = reference_src_holding("vllm/v1/core/kv_cache_planning.py", "vLLM 0.34.0")
    assert bench("benchmarks/vllm_kv_plan.py").main(["--reference-src", str(root), "--max-model-len", "4096",
                                        "--models", "Meta-Llama-3.1-70B"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Meta-Llama-3.1-70B | ")]
    assert "refuses" not in row


@pytest.fixture
def scripts_importable() -> Iterator[None]:
    """benchmarks/ importable by name (the scripts import each other), with no reference tree."""
    with benchmarks_importable():
        yield


def test_bench_allocator_runs_ours_alone_without_the_reference(scripts_importable: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness on our allocators (token and paged), as measure() runs them beside SGLang's and vLLM's: each
    workload's step, its timing over one chunk, and the table it is printed in."""
    b = bench("benchmarks/bench_allocator.py")
    monkeypatch.setattr(b, "TIME_BOX_S", 0.0)
    monkeypatch.setattr(b, "MAX_STEPS", b.CHUNK)
    cpu = torch.device("cpu")
    rows = []
    for ps, workload in ((1, "page 1"), (16, "decode"), (16, "extend")):
        a = b.our_allocator(8192, ps, cpu)
        held = a.alloc(8192 // 2 // ps * ps)
        batches = None if ps == 1 else b.Batches(ps, (held[::ps] // ps).cpu(), cpu)
        best = b.step_times({"ours": (b.token_steps(a, ps, batches, workload), cpu)}, trials=1)
        wall, inside = best["ours"]
        assert 0 < inside <= wall and b.syncs_per_step(b.token_steps(a, ps, batches, workload), cpu) is None
        rows.append(b.Row(workload, ps, 8192, wall * 1e6, None, None, inside * 1e6, None, None, None, None, None))
    table = b.markdown(rows, gpu=False).splitlines()
    assert len(table) == 4 + 3 and table[4].startswith("| page 1 | 1 | 8,192 | ")


def test_reference_allocators_loads_one_definition_of_a_source_file(tmp_path: Path, scripts_importable: None) -> None:
    """The loader's two moves on a source tree of our own: a whole module by path, and one definition of a file
    whose other lines could not be imported (the reference engines' modules import half their runtime)."""
    b = bench("benchmarks/reference_allocators.py")
    source = tmp_path / "engine_module.py"
    source.write_text("import module_that_is_not_there\n\nPAGE = 16\n\n\ndef pages(tokens: int) -> int:\n"
                      "    return -(-tokens // PAGE)\n")
    namespace: dict[str, Any] = {}
    assert b._definition_from(source, "PAGE", namespace) == 16
    assert b._definition_from(source, "pages", namespace)(33) == 3
    plain = tmp_path / "plain_module.py"
    plain.write_text("ANSWER = 42\n")
    try:
        assert b._load("plain_module_smoke", plain).ANSWER == 42
    finally:
        sys.modules.pop("plain_module_smoke", None)


def test_sglang_request_fakes_carry_the_lengths_sglangs_helpers_read() -> None:
    """Req and Batch as sglang_radix_trace hands them to SGLang's cache helpers, without SGLang: an extend batch's
    prefix and extend lengths, and a decode batch's committed lengths and request rows."""
    from array import array
    from types import SimpleNamespace

    f = bench("benchmarks/sglang_request_fakes.py")
    reqs = [f.Req(rid=str(i), origin_input_ids=array("q", range(10)), prefix_len=4 * i, extend_end=10,
                  kv=SimpleNamespace(kv_committed_len=10 + i, req_pool_idx=i + 1, holds_kv=True)) for i in range(2)]
    extend = f.Batch(reqs=reqs, tree_cache=None, req_to_token_pool=None).for_extend()
    assert (extend.prefix_lens, extend.extend_lens, extend.extend_num_tokens) == ([0, 4], [10, 6], 16)
    assert extend.seq_lens.tolist() == [10, 10]
    decode = f.Batch(reqs=reqs, tree_cache=None, req_to_token_pool=None).for_decode()
    assert decode.seq_lens.tolist() == [10, 11] and decode.req_pool_indices.tolist() == [1, 2]
    reqs[0].refresh_fill_ids()
    assert not reqs[0].finished() and list(reqs[0].full_untruncated_fill_ids) == list(range(10))


def test_vllm_steps_times_a_block_pool_step_without_vllm() -> None:
    """block_pool_step against a pool with vLLM's BlockPool calls (get_new_blocks, free_blocks): every block taken
    is given back, each step timed; and the Request stand-in's token counts."""
    pytest.importorskip("numpy", reason="benchmarks/vllm_steps.py imports NumPy, which this project does not install")
    v = bench("benchmarks/vllm_steps.py")

    class Pool:
        def __init__(self) -> None:
            self.free = list(range(64))

        def get_new_blocks(self, count: int) -> list[int]:
            taken, self.free = self.free[:count], self.free[count:]
            return taken

        def free_blocks(self, blocks: list[int]) -> None:
            self.free.extend(blocks)

    pool = Pool()
    step = v.block_pool_step(pool, 16)
    assert all(step(i) >= 0 for i in range(3)) and sorted(pool.free) == list(range(64))
    request = v._Request("r", computed=7, prompt=5, status=None)
    assert (request.num_tokens, request.num_prompt_tokens, request.num_in_flight_tokens) == (8, 5, 0)



# Where each script in benchmarks/ runs in CI (a test that calls it, its main or its functions); helpers that only
# other scripts import run with those. A new script without a smoke form fails the test below.
SMOKED = {
    "benchmarks/bench_allocator.py": "test_benchmark_smoke.py::test_bench_allocator_runs_ours_alone_without_the_reference",
    "benchmarks/bench_fit.py": "test_benchmark_smoke.py::test_bench_fit",
    "benchmarks/bench_plan.py": "test_benchmark_smoke.py::test_bench_plan",
    "benchmarks/gpu_fault_matrix.py": "test_benchmark_smoke.py::test_gpu_fault_matrix",
    "benchmarks/gpu_headroom.py": "test_benchmark_smoke.py::test_gpu_headroom",
    "benchmarks/gpu_measured_headroom.py": "test_benchmark_smoke.py::test_gpu_measured_headroom",
    "benchmarks/gpu_op_costs.py": "test_benchmark_smoke.py::test_gpu_op_costs",
    "benchmarks/gpu_pool_build.py": "test_benchmark_smoke.py::test_gpu_pool_build",
    "benchmarks/gpu_post_capture_resize.py": "test_benchmark_smoke.py::test_gpu_post_capture_resize",
    "benchmarks/gpu_ranks.py": "test_benchmark_smoke.py::test_gpu_ranks",
    "benchmarks/reference_allocators.py": "test_benchmark_smoke.py::test_reference_allocators_loads_one_definition_of_a_source_file",
    "benchmarks/reference_tree.py": "reference_sources.py::reference_src_holding",  # every reference test reads the tree through it
    "benchmarks/sglang_radix_trace.py": "test_sglang_radix_trace.py::test_sglang_radix_cache_runs_on_our_objects_and_matches_sglangs_allocator",
    "benchmarks/sglang_request_fakes.py": "test_benchmark_smoke.py::test_sglang_request_fakes_carry_the_lengths_sglangs_helpers_read",
    "benchmarks/vllm_kv_plan.py": "test_benchmark_smoke.py::test_vllm_kv_plan",
    "benchmarks/vllm_steps.py": "test_benchmark_smoke.py::test_vllm_steps_times_a_block_pool_step_without_vllm",
}


def test_every_benchmark_script_has_a_smoke_form_in_ci() -> None:
    scripts = sorted(f"benchmarks/{p.name}" for p in BENCHMARKS.glob("*.py"))
    assert scripts == sorted(SMOKED), f"give each script in benchmarks/ a smoke form here: {set(scripts) ^ set(SMOKED)}"
    tests = Path(__file__).resolve().parent
    for script, where in SMOKED.items():
        file, function = where.split("::")
        assert f"def {function}(" in (tests / file).read_text(), f"{script}: {where} is not there"
