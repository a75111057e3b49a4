"""The one engine fixture: build engine containers (the tiny model by default) and shut every one down."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from containers import EngineContainer
from kvcache.cards import SimulatedCard
from kvcache.memory_probe import MemoryProbe
from kvcache.model_config import ModelConfig
from kvcache.presets import load_model_config
from kvcache.server_args import ServerArgs
from kvcache.testing import tiny_model_config

EngineFactory = Callable[..., EngineContainer]


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
