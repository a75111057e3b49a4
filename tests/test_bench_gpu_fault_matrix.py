"""benchmarks/gpu_fault_matrix.py's CUDA starts turn on what they are named for: its resizing starts build VMM pools
and resize them after graph capture (a start with --kv-cache-memory does neither: its graph and resize hooks were
never hit, so the H200 walk of 2026-12-04 checked no failure there). Read on the CPU, the rule asked as on CUDA."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from app.cli import build_parser, parse_command_line, server_args_from
from containers import EngineContainer
from kvcache.inputs.cards import card_named
from kvcache.testing import tiny_model_config

_SPEC = importlib.util.spec_from_file_location(
    "gpu_fault_matrix", Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_fault_matrix.py")
assert _SPEC is not None and _SPEC.loader is not None
gpu_fault_matrix = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_fault_matrix)  # its own sys.path entry is the repository root, already importable


def _eligibility_on_cuda(argv: list[str]):  # type: ignore[no-untyped-def]
    args = server_args_from(parse_command_line(build_parser(), argv), device="meta")
    engine = EngineContainer(server_args=args, model_config=tiny_model_config(), card=card_named("H200"))
    sizing = engine.target.configurator().sizing
    return dataclasses.replace(sizing, device_type="cuda").post_capture_resize()


@pytest.mark.parametrize(("name", "active", "measured"), [
    ("cuda", False, False),
    ("cuda + graphs + resize", True, False),
    ("cuda + graphs + measured", True, True),
])
def test_each_cuda_start_resizes_as_its_name_says(name: str, active: bool, measured: bool) -> None:
    configurations = gpu_fault_matrix.configurations("cuda", "tiny/config.json")
    assert set(configurations) == {"cuda", "cuda + graphs + resize", "cuda + graphs + measured"}
    eligibility = _eligibility_on_cuda(configurations[name])
    assert (eligibility.active, eligibility.measured) == (active, measured), eligibility.reason


def test_the_resize_hook_is_the_one_road_every_resize_takes() -> None:
    """Both resizes (post-capture, and the measured sizing's two) map through kvcache.runtime.live_resize, failed
    there after the allocator swap; tests/test_vmm_resize_fake_driver.py counts its hits in each start on the CPU."""
    hooked = {(getattr(owner, "__name__", ""), attribute) for owner, attribute, point in gpu_fault_matrix.ENGINE_HOOKS
              if point == "resize"}
    assert hooked == {("kvcache.runtime.live_resize", "map_to_targets")}
