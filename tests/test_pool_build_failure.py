"""A pool build that fails with any error, not only an out-of-memory one, holds no arena afterwards."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcache.testing.arena_census import ArenaCensus
from kvcache.byte_units import GiB, MiB
from kvcache.errors import PoolBuildError, PoolOutOfMemoryError
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.testing import FailingAllocatorFactory
from kvcache.testing.fakes import TINY_MODEL_HF_CONFIG


def _host_allocator_refusal() -> RuntimeError:
    """The RuntimeError this torch's CPU allocator really raises when it cannot allocate."""
    try:
        torch.empty(1 << 62, dtype=torch.uint8)
    except RuntimeError as refusal:
        return refusal
    raise AssertionError("the host allocated 4 EiB")


REFUSED = [  # the device or host refusing memory: does not fit
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    _host_allocator_refusal(),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                 "you tried to allocate 4096 bytes."),
    OSError(errno.ENOMEM, "Cannot allocate memory"),  # the host arena's mmap
]
NOT_REFUSED = [  # anything else that fails mid-build is a bug, whatever its type
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("view size is not compatible with input tensor's size and stride"),
    OSError(errno.EACCES, "Permission denied"),
]


def _refusing_allocator(*, plan: Any, device: torch.device, kvcache: Any = None, views: Any = None) -> Any:
    raise ValueError("this allocator refuses the plan (simulated)")


def test_an_error_that_is_not_out_of_memory_still_frees_the_arena(make_engine: Any) -> None:
    from dependency_injector import providers

    engine = make_engine(kv_cache_memory=64 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    engine.target.allocator_factory.override(providers.Callable(_refusing_allocator))
    with ArenaCensus().installed() as census, pytest.raises(ValueError, match="refuses the plan") as caught:
        engine.target.configurator().configure(pre_model_load_memory=GiB)
    # no gc.collect(): while the error is still held, its frames must not keep the arena alive
    assert caught.value is not None and census.made == 1 and census.alive() == 0


@pytest.mark.parametrize(
    ("error", "code", "kind", "line_start"),
    [  # a broken builder invariant is a bug; the device refusing the arena's memory does not fit
        (PoolBuildError("expected one attention pool, got []"), 1, "internal_error",
         "kvcache: internal error: PoolBuildError: expected one attention pool, got [] (a bug in kvcache"),
        (torch.OutOfMemoryError("CUDA out of memory (simulated)"), 3, "does_not_fit",
         "kvcache: does not fit: out of memory: building the KV pools"),
        (_host_allocator_refusal(), 3, "does_not_fit", "kvcache: does not fit: out of memory: building the KV pools"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), 1, "internal_error",
         "kvcache: internal error: RuntimeError: CUDA error: an illegal memory access was encountered (a bug"),
    ],
)
def test_the_cli_reports_a_broken_build_invariant_as_a_bug_and_out_of_memory_as_does_not_fit(
        error: BaseException, code: int, kind: str, line_start: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """On a bootstrap, which builds the pools (`plan` builds none: app.dry_run), of the tiny test model on the CPU."""
    from dependency_injector import providers

    import app.cli as cli
    import containers
    from containers import EngineContainer

    def engine_whose_build_fails(**kwargs: Any) -> EngineContainer:
        container = EngineContainer(**kwargs)
        container.target.allocator_factory.override(providers.Callable(FailingAllocatorFactory(error)))
        return container

    model = tmp_path / "config.json"
    model.write_text(json.dumps(TINY_MODEL_HF_CONFIG))
    monkeypatch.setattr(containers, "EngineContainer", engine_whose_build_fails)  # what bootstrap imports when it runs
    assert cli.main(["bootstrap", "--device", "cpu", "--model", str(model), "--memory-limit", "256MiB",
                     "--kv-cache-memory", "16MiB", "--json"]) == code
    captured = capsys.readouterr()
    assert captured.err.startswith(line_start) and captured.err.count("\n") == 1, captured.err
    failure = json.loads(captured.out)["error"]
    assert (failure["kind"], failure["exit_code"]) == (kind, code)


def configure_with_arena_failing(error: BaseException, make_engine: Any, mocker: Any) -> None:
    """Configure a small CPU engine whose pool arena raises `error` when allocated."""
    engine = make_engine(kv_cache_memory=64 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    mocker.patch("kvcache.pools.builder.Arena", side_effect=error)
    engine.target.configurator().configure(pre_model_load_memory=GiB)


@pytest.mark.parametrize("error", REFUSED, ids=lambda e: str(e)[:40])
def test_only_the_device_refusing_memory_mid_build_becomes_out_of_memory(
        error: BaseException, make_engine: Any, mocker: Any) -> None:
    with pytest.raises(PoolOutOfMemoryError, match="failed part-way on cpu") as caught:
        configure_with_arena_failing(error, make_engine, mocker)
    assert caught.value.__cause__ is error


@pytest.mark.parametrize("error", NOT_REFUSED, ids=lambda e: str(e)[:40])
def test_a_runtime_error_that_is_not_out_of_memory_is_raised_as_itself(
        error: BaseException, make_engine: Any, mocker: Any) -> None:
    """It used to be read as out of memory (exit 3, 'lower --mem-fraction-static') whatever it said."""
    with pytest.raises(type(error)) as caught:
        configure_with_arena_failing(error, make_engine, mocker)
    assert caught.value is error and not isinstance(caught.value, PoolBuildError)
