"""On a CUDA device: VMM storage keeps what it is told, graph replay equals eager decode, the resize keeps
the headroom and the outputs. Skipped without CUDA (measured on an H200: benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_vmm_allocation_releases_what_is_not_kept_and_keeps_its_bytes():
    from kvcache.memory.vmm_storage import VmmAllocation

    alloc = VmmAllocation(64 << 20, torch.device("cuda"), chunk_bytes=16 << 20)
    view = alloc.view(0, 64 << 20)
    view.copy_(torch.arange(64 << 20, device="cuda").remainder(251).to(torch.uint8))
    keep = [(0, (17 << 20) + 3)]
    expected = view[: keep[0][1]].clone()
    assert alloc.keep_only(keep) == (64 << 20) - (16 << 20) - alloc.granularity
    assert torch.equal(alloc.view(0, keep[0][1]), expected)


def test_graph_replay_equals_eager_decode_and_survives_the_resize(make_engine):
    args = {"device": "cuda", "enable_post_capture_kv_resize": True, "cuda_graph_max_bs": 16,
            "max_running_requests": 16, "context_length": 4096}
    engine = make_engine(model="Llama-3.2-1B-Instruct", **args)
    runner = engine.engine().target
    runner.load_weights()
    runner.init_memory_pool()
    requests = runner.decode_requests()
    rows = requests.add(5)
    for _ in range(3):
        runner.forward_decode(requests.step(rows, torch.arange(5, device="cuda")))
    batch = requests.step(rows, torch.arange(5, device="cuda"))
    eager = runner.forward_decode(batch).clone()
    runner.capture_decode_graphs()
    replayed = runner.decode_graphs.replay(batch).clone()
    assert torch.equal(replayed, eager)
    assert torch.equal(runner.decode(batch), replayed)  # a batch a graph holds is replayed
    del requests
    resize = runner.post_capture_resize_kv_pool()
    assert resize.tokens_after <= resize.tokens_before
    assert runner.memory_probe.free_bytes() >= resize.headroom_bytes
    assert torch.equal(runner.decode_graphs.replay(batch), replayed)


@pytest.mark.parametrize("max_bs", [16, 0])
def test_an_engine_bootstrap_with_the_knob_on_captures_and_resizes(max_bs, make_engine):
    args = {"device": "cuda", "enable_post_capture_kv_resize": True, "cuda_graph_max_bs": max_bs,
            "max_running_requests": 16, "context_length": 4096, "kv_headroom": "fraction"}
    engine = make_engine(model="Llama-3.2-1B-Instruct", **args)
    engine.engine().bootstrap()
    runner = engine.engine().target
    assert runner.graph_capture is not None and runner.post_capture_kv_resize is not None
    assert runner.graph_capture.max_bs == max_bs and (runner.decode_graphs is None) == (max_bs == 0)
    assert runner.memory_probe.free_bytes() >= runner.post_capture_kv_resize.headroom_bytes


def test_a_remap_that_fails_on_the_driver_leaves_every_byte_mapped_and_the_kept_bytes_intact():
    from kvcache.memory.cuda_virtual_memory import CudaVirtualMemory
    from kvcache.errors import VmmError
    from kvcache.memory.vmm_storage import VmmAllocation

    class FailingMap(CudaVirtualMemory):
        armed = False

        def map(self, address, nbytes, handle):  # type: ignore[no-untyped-def]
            if self.armed:
                self.armed = False
                raise VmmError("cuMemMap failed (injected)")
            super().map(address, nbytes, handle)

    memory = FailingMap(torch.device("cuda"))
    alloc = VmmAllocation(64 << 20, torch.device("cuda"), chunk_bytes=16 << 20, memory=memory)
    view = alloc.view(0, 64 << 20)
    view.copy_(torch.arange(64 << 20, device="cuda").remainder(251).to(torch.uint8))
    keep = [(0, (17 << 20) + 3)]
    expected = view[: keep[0][1]].clone()
    memory.armed = True  # the straddling chunk's replacement cannot be mapped
    with pytest.raises(VmmError, match="injected"):
        alloc.keep_only(keep)
    assert alloc.mapped_bytes == alloc.reserved
    assert torch.equal(alloc.view(0, keep[0][1]), expected)
    assert alloc.keep_only(keep) == (64 << 20) - (16 << 20) - alloc.granularity
    assert torch.equal(alloc.view(0, keep[0][1]), expected)
