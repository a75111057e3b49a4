"""A pool build that fails with any error, not only an out-of-memory one, holds no arena afterwards."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvcache import device_buffers
from kvcache.byte_units import GiB, MiB
from kvcache.memory_probe import FixedMemoryProbe


def _refusing_allocator(*, plan: Any, device: torch.device, kvcache: Any = None) -> Any:
    raise ValueError("this allocator refuses the plan (simulated)")


def test_an_error_that_is_not_out_of_memory_still_frees_the_arena(make_engine: Any) -> None:
    from dependency_injector import providers

    engine = make_engine(kv_cache_memory=64 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    engine.target.allocator_factory.override(providers.Callable(_refusing_allocator))
    arenas_before = len(device_buffers._ARENAS)
    with pytest.raises(ValueError, match="refuses the plan") as caught:
        engine.target.configurator().configure(pre_model_load_memory=GiB)
    # no gc.collect(): while the error is still held, its frames must not keep the arena alive
    assert caught.value is not None and len(device_buffers._ARENAS) == arenas_before
