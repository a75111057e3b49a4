"""kvcache.testing: the fakes behave like what they stand for, and the pytest plugin's fixtures work."""

from __future__ import annotations

import pytest
import torch

from kvcache.byte_units import GiB
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.testing import RecordingAllocator, fixed_card_probe, tiny_model_config
from kvcache.testing.allocator_plans import token_allocator


def test_recording_allocator_records_and_delegates() -> None:
    inner = token_allocator(size=8, device=torch.device("cpu"))
    rec = RecordingAllocator(inner)
    idx = rec.alloc(3)
    assert idx is not None and rec.available_size() == 5
    rec.free_group_begin()
    rec.free(idx)
    rec.free_group_end()
    assert rec.available_size() == 8
    assert [name for name, _ in rec.calls] == [
        "alloc", "available_size", "free_group_begin", "free", "free_group_end", "available_size"]
    assert rec.calls[0] == ("alloc", 3) and rec.calls[3] == ("free", 3)
    assert (rec.size, rec.page_size, rec.nbytes) == (8, 1, inner.nbytes)


def test_fixed_probe_debits_noted_allocations() -> None:
    probe = fixed_card_probe(2, 1)
    assert isinstance(probe, MemoryProbe)
    assert (probe.total_bytes(), probe.free_bytes()) == (2 * GiB, GiB)
    probe.note_allocation(GiB // 4)
    assert probe.free_bytes() == GiB - GiB // 4


def test_tiny_model_takes_overrides() -> None:
    model = tiny_model_config(num_hidden_layers=3)
    assert model.num_hidden_layers == 3 and model.layer_kinds == ("full_attention",) * 3


def test_plugin_fixtures(tiny_model: ModelConfig, one_gib_card: FixedMemoryProbe) -> None:
    assert tiny_model.name == "tiny-llama" and tiny_model.num_key_value_heads == 2
    assert one_gib_card.total_bytes() == one_gib_card.free_bytes() == GiB


def test_fake_cuda_readings_answer_for_a_simulated_card_and_give_torch_its_own_back() -> None:
    from kvcache.testing import FakeCudaReadings

    own = torch.cuda.mem_get_info
    readings = FakeCudaReadings(total_bytes=2 * GiB, free_bytes=GiB)
    with readings.installed():
        assert torch.cuda.mem_get_info() == (GiB, 2 * GiB) and torch.cuda.memory_allocated() == 0
        torch.cuda.synchronize()
    assert torch.cuda.mem_get_info is own and readings.calls == {"mem_get_info": 1, "memory_allocated": 1,
                                                                 "synchronize": 1}
    with pytest.raises(ValueError, match="must lie within the card's"):
        FakeCudaReadings(total_bytes=GiB, free_bytes=2 * GiB)
