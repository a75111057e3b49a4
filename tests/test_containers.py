"""The container wiring: dependencies, overrides on instances, isolation, target/draft sharing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dependency_injector import errors, providers

from containers import EngineContainer, WorkerContainer
from kvcache.byte_units import GiB, MiB
from kvcache.inputs.dtypes import BFLOAT16
from kvcache.configurator import KVCacheConfigurator
from kvcache.errors import KVCacheError
from kvcache.memory.memory_probe import HostMemoryProbe, MemoryProbe
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.inputs.parallel import ParallelState
from kvcache.testing import RecordingAllocator, RecordingStream


def test_check_dependencies_passes_for_a_wired_engine(make_engine) -> None:
    engine = make_engine()
    engine.check_dependencies()


def test_a_bare_worker_container_names_what_it_lacks() -> None:
    with pytest.raises(errors.Error, match="server_args"):
        WorkerContainer().check_dependencies()


def test_the_probe_follows_the_device(make_engine) -> None:
    assert isinstance(make_engine(device="cpu").memory_probe(), HostMemoryProbe)
    with pytest.raises(Exception, match="needs a card"):
        make_engine(device="meta").memory_probe()


def test_overriding_the_probe_on_an_instance_changes_the_plan(make_engine) -> None:
    engine = make_engine(mem_fraction_static=0.5)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    plan = runner.memory_pool_config
    weights = runner.weights.total_bytes
    # tiny model: embed + head 2 x 256 x 64, per layer q/o 64x64, k/v 32x64, mlp 3 x 64 x 128, 2 norms; final norm
    assert runner.weights.parameter_count == 2 * 256 * 64 + 2 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64) + 64
    assert runner.weights.tensor_bytes == runner.weights.parameter_count * 2
    assert weights == 10 * MiB  # the weights' one allocation: the smallest arena (its own CUDA segment)
    assert plan.budget.free_after_load_bytes == GiB - weights
    assert plan.budget.budget_bytes == GiB - weights - GiB // 2
    assert plan.total_bytes <= plan.budget.budget_bytes
    assert plan.bytes_per_token == 2 * 2 * (16 + 16) * 2  # 2 layers x 2 KV heads x (16 + 16) x bf16


def test_two_engine_containers_share_nothing(make_engine) -> None:
    a, b = make_engine(), make_engine()
    assert a.engine() is not b.engine()
    assert a.target.model_runner() is not b.target.model_runner()
    assert a.memory_probe() is not b.memory_probe()


def test_overriding_one_instance_leaves_the_class_and_others_alone(make_engine) -> None:
    a, b = make_engine(), make_engine()
    fake = FixedMemoryProbe(total_bytes=GiB)
    a.memory_probe.override(fake)
    assert a.memory_probe() is fake
    assert b.memory_probe() is not fake
    assert not EngineContainer.memory_probe.overridden


def test_the_configurator_provider_can_be_swapped(make_engine) -> None:
    engine = make_engine(kv_cache_memory=64 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    real = engine.target.configurator()
    capped = dataclasses.replace(real, settings=real.settings.replace(max_total_tokens=1000))
    engine.target.configurator.override(providers.Object(capped))
    runner = engine.engine().target
    runner.initialize()
    assert runner.max_total_num_tokens == 1000


def test_configure_is_called_once_with_the_pre_load_free_bytes(make_engine, mocker) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    spy = mocker.spy(KVCacheConfigurator, "configure")
    engine.engine().bootstrap()
    assert spy.call_count == 1
    assert spy.call_args.kwargs == {"pre_model_load_memory": GiB, "shared": None}  # a target: no target's cache


def test_an_autospec_probe_is_strict_about_its_interface(make_engine, mocker) -> None:
    probe = mocker.create_autospec(MemoryProbe, instance=True)
    probe.free_bytes.return_value = GiB
    probe.total_bytes.return_value = GiB
    engine = make_engine(kv_cache_memory=16 * MiB)
    engine.memory_probe.override(probe)
    engine.engine().bootstrap()
    assert probe.note_allocation.called
    with pytest.raises(AttributeError):
        probe.free_memory  # a misspelt method does not exist on an autospec


def test_streams_and_dtypes_reach_the_runner_uncopied(make_engine) -> None:
    engine = make_engine()
    stream = engine.target.forward_stream()
    runner = engine.target.model_runner()
    assert runner.forward_stream is stream  # a singleton, not a deep copy
    assert engine.target.configurator().model_dtype == BFLOAT16
    assert engine.target.kv_cache_dtype().name == "bfloat16"


def test_without_speculation_there_is_no_draft(make_engine) -> None:
    engine = make_engine()
    assert engine.engine().draft is None
    assert engine.draft_model_config() is None


def test_draft_config_comes_from_the_algorithm(make_engine) -> None:
    engine = make_engine(model="DeepSeek-V3", speculative_algorithm="NEXTN")
    draft = engine.draft_model_config()
    assert draft.num_hidden_layers == 1 and draft.layer_kinds == ("mla",) and draft.nextn_of_target


def test_a_draft_s_sizing_is_known_before_its_target_has_a_cache(make_engine) -> None:
    """The draft's configurator (and so its refusals) needs nothing of the target; it takes the target's cache only
    when it configures, and a configure without it (or a target's with one) is refused as the bug it would be."""
    engine = make_engine(model="DeepSeek-V3", speculative_algorithm="NEXTN")
    draft = engine.draft.configurator()
    assert draft.sizing.is_draft_worker and draft.sizing.pool_name_prefix == "draft_"
    assert not engine.target.configurator().sizing.is_draft_worker
    assert not engine.engine().target.is_configured  # nothing of the target was asked for
    with pytest.raises(KVCacheError, match="is_draft_worker=True, shared=False"):
        draft.configure(pre_model_load_memory=GiB)


def test_an_allocator_factory_overridden_on_the_instance_is_used(make_engine) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB, page_size=4)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    engine.target.allocator_factory.override(providers.Callable(RecordingAllocator.from_plan))
    runner = engine.engine().target
    runner.initialize()
    allocator = runner.token_to_kv_pool_allocator
    assert isinstance(allocator, RecordingAllocator)
    assert allocator.size == runner.max_total_num_tokens and allocator.page_size == 4
    assert allocator.alloc(8).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # pages 1 and 2; page 0 is padding
    assert allocator.calls == [("alloc", 8)]
    assert allocator.get_kvcache() is runner.token_to_kv_pool
    assert not WorkerContainer.allocator_factory.overridden


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_bootstrapped_allocator_addresses_the_runner_s_kv_pool(make_engine, page_size: int) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB, page_size=page_size)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    engine.engine().bootstrap()
    runner = engine.engine().target
    assert runner.token_to_kv_pool is not None
    assert runner.token_to_kv_pool_allocator.get_kvcache() is runner.token_to_kv_pool


def test_a_forward_stream_overridden_on_the_instance_builds_the_pools(make_engine) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    stream = RecordingStream(torch.device("cpu"))
    engine.target.forward_stream.override(stream)
    runner = engine.engine().target
    runner.initialize()
    assert runner.forward_stream is stream
    assert engine.target.configurator().forward_stream is stream
    assert stream.entered == 1 and stream.synchronized == 1  # the build was queued on it and waited for


def test_the_probe_must_be_a_memory_probe(make_engine) -> None:
    engine = make_engine()
    engine.memory_probe.override("80GiB")
    with pytest.raises(errors.Error, match="MemoryProbe"):
        engine.target.configurator()


def test_overriding_the_parallel_state_changes_specs_and_reserve_together(make_engine) -> None:
    """On a 40 GiB card with chunked prefill 4096 (no CUDA graphs on the CPU), SGLang's reserve is
    512 + 1.5 * 4096 + tp / 8 * 1024 MiB: 6,784 MiB at TP 1 -> 0.834, 6,912 MiB at TP 2 -> 0.831."""
    card = FixedMemoryProbe(total_bytes=40 * GiB)
    plain = make_engine(chunked_prefill_size=4096)
    plain.memory_probe.override(card)
    assert plain.target.configurator().sizing.mem_fraction_static(40 * GiB) == 0.834
    two = make_engine(chunked_prefill_size=4096)  # its ServerArgs still say --tp-size 1
    two.memory_probe.override(card)
    two.parallel_state.override(providers.Object(ParallelState(tp_size=2)))
    configurator = two.target.configurator()
    assert configurator.sizing.mem_fraction_static(40 * GiB) == 0.831
    assert configurator.sizing.layout().kv_groups[0].bytes_per_token == 2 * 1 * (16 + 16) * 2  # one KV head a rank
    by_flag = make_engine(chunked_prefill_size=4096, tp_size=2)
    by_flag.memory_probe.override(card)
    assert by_flag.target.configurator().sizing.mem_fraction_static(40 * GiB) == 0.831
