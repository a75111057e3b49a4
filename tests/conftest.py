"""The one engine fixture: build engine containers (the tiny model by default) and shut every one down.
On CUDA every test also ends with its device memory handed back, so the next test's probe starts clean.
Also: Hypothesis runs derandomized, a skip for a reason CI does not allow fails (tests/skip_policy.py), and torch
runs its CPU ops on one thread."""

from __future__ import annotations

import gc
import sys
from typing import Any, Callable

import pytest
import torch
from hypothesis import settings

from skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (hooks: a skip CI does not allow fails)

from containers import EngineContainer
from kvcache.inputs.cards import SimulatedCard
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import load_model_config
from kvcache.inputs.server_args import ServerArgs
from kvcache.testing import tiny_model_config

EngineFactory = Callable[..., EngineContainer]

# Property tests draw the same examples on every run (a seed derived from each test), so CI cannot pass or
# fail by luck; a failure found once is pinned with @example. `--hypothesis-profile explore` draws fresh ones.
settings.register_profile("derandomized", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile("derandomized")

# The tests' CPU tensors are small: on a 2-core CI box torch's intra-op threads cost more in hand-offs than they
# gain (the forward tests ran 3x slower with 2 threads than with 1). Nothing here tests threading.
torch.set_num_threads(1)


@pytest.fixture
def make_engine() -> EngineFactory:
    """make_engine(model=..., probe=..., card=..., **server_args) -> an EngineContainer (on the CPU unless
    `device` says otherwise), its probe overridden when one is given; `model` is a ModelConfig or a preset
    name. Every engine made is shut down when the test ends, passed or failed."""
    made: list[EngineContainer] = []

    def make(*, model: ModelConfig | str | None = None, probe: MemoryProbe | None = None,
             card: SimulatedCard | None = None, **args: Any) -> EngineContainer:
        args.setdefault("device", "cpu")
        config = load_model_config(model) if isinstance(model, str) else model or tiny_model_config()
        engine = EngineContainer(server_args=ServerArgs.from_mapping(args), model_config=config, card=card)
        if probe is not None:
            engine.memory_probe.override(probe)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown_resources()


@pytest.fixture(autouse=True)
def cuda_memory_handed_back() -> Any:
    """A real engine bootstraps in a fresh process; tests share one, so each CUDA test ends by collecting the
    objects it left in reference cycles (VMM pools and graph pools are freed with them) and emptying torch's
    cache: the next engine's free-memory probe then sees the whole card again."""
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # pytest keeps a failed test's exception (sys.last_*) for post-mortems: its frames would hold that test's
        # pools and let one failure fill the card for every test after it
        sys.last_type = sys.last_value = sys.last_traceback = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
