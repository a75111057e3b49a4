"""ModelRunner on the CPU with a fixed probe: phases, what it keeps, failures that leave nothing behind."""

from __future__ import annotations

import dataclasses
import gc
import weakref

from typing import Any

import pytest
import torch

from kvcache.inputs.dtypes import BFLOAT16, FLOAT32
from kvcache.memory import device_buffers
from kvcache.byte_units import GiB, MiB
from kvcache.errors import KVCacheError, PoolBuildError, WeightsDoNotFitError
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.presets import load_model_config


def test_the_runner_keeps_what_sglang_keeps(make_engine) -> None:
    engine = make_engine(kv_cache_memory=32 * MiB, page_size=4)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    result = runner.initialize()
    assert runner.pre_model_load_memory == GiB
    assert runner.kv_cache is result
    assert runner.max_total_num_tokens == result.memory_pool_config.max_total_num_tokens > 0
    assert runner.max_total_num_tokens % 4 == 0
    assert runner.max_running_requests == result.memory_pool_config.max_running_requests
    assert runner.req_to_token_pool is result.req_to_token_pool
    assert runner.token_to_kv_pool is result.token_to_kv_pool
    assert runner.token_to_kv_pool_allocator is result.token_to_kv_pool_allocator
    assert result.model_dtype == BFLOAT16 and result.kv_cache_dtype.name == "bfloat16"
    assert set(runner.timings) == {"profile_before_load_s", "load_weights_s", "configure_kv_cache_s"}


def test_dummy_weights_are_real_tensors_on_cpu_and_nothing_on_meta(make_engine) -> None:
    cpu = make_engine(model=load_model_config("SmolLM2-135M"), kv_cache_memory=64 * MiB, context_length=512)
    cpu.memory_probe.override(FixedMemoryProbe(total_bytes=4 * GiB))
    weights = cpu.engine().target.load_weights()
    assert weights.parameter_count == 134_515_008  # SmolLM2-135M, tied embeddings
    assert weights.tensor_bytes == 134_515_008 * 2
    assert weights.total_bytes == 129 * 2 * MiB  # one arena: the 512-aligned tensors rounded up to 2 MiB
    assert next(iter(weights.tensors.values())).device.type == "cpu"
    meta = make_engine(device="meta", model=load_model_config("SmolLM2-135M"))
    meta.memory_probe.override(FixedMemoryProbe(total_bytes=4 * GiB))
    meta_weights = meta.engine().target.load_weights()
    assert meta_weights.total_bytes == weights.total_bytes
    assert all(t.device.type == "meta" for t in meta_weights.tensors.values())


def test_configure_before_loading_is_an_error(make_engine) -> None:
    with pytest.raises(KVCacheError, match="load_weights\\(\\) must run before init_memory_pool"):
        make_engine().engine().target.init_memory_pool()


def test_weights_larger_than_the_card_fail_before_allocating(make_engine) -> None:
    engine = make_engine(device="meta", model=load_model_config("Llama-3.1-8B-Instruct"))
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=8 * GiB))
    # An 8 GiB card keeps 4.34 GiB free at TP 4 (mem_fraction_static 0.457) and 4.84 GiB at TP 8 (0.395). TP 4's
    # 3.74 GiB of weights leave 8 - 3.74 - 0.09 (kernels) = 4.17 GiB: under the reserve, the runtime would have
    # no room; TP 8's 1.87 GiB leave 6.04 GiB, the reserve and some KV cache: not a full 131K-token request, but
    # SGLang 0.5.23 runs that, each request capped at the pool less one token: 2,049 rows of 131,072 int32
    # (1,074,266,112 B) and 12,869 tokens of 16,384 B (1 KV head a rank) fill its ~1.2 GiB budget
    with pytest.raises(WeightsDoNotFitError, match="--tp-size 8 \\(about 1.87 GiB \\(2,009,071,616 B\\) per rank, "
                                                   "each request capped at 12,866 tokens\\)\\n"):
        engine.engine().target.load_weights()


def _weights_failure(make_engine, model: str, total_bytes: int, **server_args) -> WeightsDoNotFitError:  # type: ignore[no-untyped-def]
    engine = make_engine(device="meta", model=load_model_config(model), **server_args)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=total_bytes))
    with pytest.raises(WeightsDoNotFitError) as caught:
        engine.engine().target.load_weights()
    return caught.value


def test_the_suggested_tp_size_splits_the_model_s_heads(make_engine) -> None:
    # SmolLM2-135M: 9 attention heads, 3 KV heads, so attention TP 1, 3 or 9 (tensor_parallel_sizes).
    # Its 270,532,608 B of weights on a 200 MiB card (209,715,200 B) at --mem-fraction-static 0.9, which keeps
    # 20,971,520 B free: TP 2 would hold its 135,266,304 B but does not split 9 heads; TP 3 does, and its
    # 90,177,536 B (0.08 GiB) plus the 96,468,992 B the card's context grows by leave 23,068,672 B, more than
    # the reserve, but no KV cache. TP 9's 33,554,432 B leave one that holds fewer tokens than one 8,192-token request:
    # SGLang 0.5.23 runs that (each request capped at the pool less one token), so TP 9 is named.
    failure = _weights_failure(make_engine, "SmolLM2-135M", 200 * MiB, mem_fraction_static=0.9)
    assert failure.needed_bytes == 270_532_608
    assert failure.suggestions == ("--tp-size 9 (about 0.03 GiB (33,554,432 B) per rank, each request capped at 2,434 "
                                   "tokens)", f"--gpu A10 (22 GiB, {CARD}")  # A10: 23,028 MiB, the smallest known


CARD = "the smallest known card that holds the weights, the runtime's reserve and one full-length request at this --tp-size)"


@pytest.mark.parametrize(("model", "total_bytes", "card"), [
    ("SmolLM2-135M", 200 * MiB, "A10 (22 GiB"), ("SmolLM2-135M", 16 * MiB, "A10 (22 GiB"),
    # Llama-3.1-8B: 14.96 GiB of weights leave a 22-24 GiB card nothing at its fraction (0.684 keeps 6.92 GiB free)
    ("Llama-3.1-8B-Instruct", 512 * MiB, "A100-40GB (40 GiB")])
def test_weights_no_tp_size_fits_suggest_only_a_larger_card(make_engine, model: str, total_bytes: int,
                                                            card: str) -> None:
    # At the derived fraction (at least 0.05 on a card below SGLang's reserve) no TP size leaves these cards the
    # runtime's reserve: 95% of 200 MiB or 16 MiB is kept free, more than any shard leaves. Llama-8B's largest TP
    # is 32 (32 heads): doubling up to 1024 suggested --tp-size 1024, which splits no 32 heads.
    failure = _weights_failure(make_engine, model, total_bytes)
    assert failure.suggestions == (f"--gpu {card}, {CARD}",)


def test_a_pool_build_failing_part_way_frees_everything(make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.load_weights()
    made: list[weakref.ref[torch.Tensor]] = []
    real = device_buffers.Arena.carve_slot

    def fail_after_the_request_table(arena: device_buffers.Arena, parts: Any) -> list[torch.Tensor]:
        if made:  # the request table's slot came first; the allocator's and the KV pool's come next
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        views = real(arena, parts)
        made.append(weakref.ref(views[0]))
        return views

    monkeypatch.setattr(device_buffers.Arena, "carve_slot", fail_after_the_request_table)
    with pytest.raises(PoolBuildError, match="failed part-way .* everything built so far was freed"):
        runner.init_memory_pool()
    gc.collect()
    assert len(made) == 1 and made[0]() is None
    assert not runner.is_configured


def test_pools_that_fail_to_build_leave_nothing_to_resize() -> None:
    from app.model_runner import ModelRunner
    from kvcache.inputs.parallel import ParallelState
    from kvcache.sizing.post_capture_eligibility import PostCaptureEligibility

    class Resizable:
        def post_capture_resize(self) -> PostCaptureEligibility:
            return PostCaptureEligibility(active=True, reason="on")

    @dataclasses.dataclass(frozen=True)
    class ResizableButFails:  # the runner gives a resizable build its VMM backing through the arena_backing field
        sizing: Resizable = dataclasses.field(default_factory=Resizable)
        arena_backing: Any = None

        def configure(self, *, pre_model_load_memory: int, shared: Any = None) -> None:
            raise PoolBuildError("the pools could not be built")

    runner = ModelRunner(role="target", model_config=load_model_config("SmolLM2-135M"), parallel_state=ParallelState(),
                         device=torch.device("cpu"), model_dtype=FLOAT32, memory_probe=FixedMemoryProbe(total_bytes=GiB),
                         configurator_factory=ResizableButFails, forward_stream=None)
    runner.pre_model_load_memory, runner.weights = GiB, object()  # type: ignore[assignment]
    with pytest.raises(PoolBuildError):
        runner.init_memory_pool()
    assert runner.start_decode_runtime() is None  # no capture, no resize over pools that do not exist
