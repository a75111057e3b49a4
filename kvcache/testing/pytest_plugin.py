"""pytest fixtures for engines built on kvcache (registered as the `kvcache` pytest plugin)."""

from __future__ import annotations

import pytest

from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.testing.fakes import fixed_card_probe, tiny_model_config


@pytest.fixture
def tiny_model() -> ModelConfig:
    """A two-layer Llama-shaped ModelConfig (256 KV bytes per token in bf16)."""
    return tiny_model_config()


@pytest.fixture
def one_gib_card() -> FixedMemoryProbe:
    """A simulated 1 GiB card with all of it free."""
    return fixed_card_probe(1)
