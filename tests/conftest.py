"""Shared test helpers: build engine containers around the tiny model and a simulated card."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from containers import EngineContainer
from kvcache.model_config import ModelConfig
from kvcache.server_args import ServerArgs
from kvcache.testing import FixedMemoryProbe, tiny_model_config

EngineFactory = Callable[..., EngineContainer]


@pytest.fixture
def make_engine() -> EngineFactory:
    """make_engine(model=..., probe=..., **server_args) -> an EngineContainer, its probe overridden."""
    made: list[EngineContainer] = []

    def make(*, model: ModelConfig | None = None, probe: FixedMemoryProbe | None = None, **args: Any) -> EngineContainer:
        args.setdefault("device", "cpu")
        engine = EngineContainer(server_args=ServerArgs.from_mapping(args), model_config=model or tiny_model_config())
        if probe is not None:
            engine.memory_probe.override(probe)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown_resources()
