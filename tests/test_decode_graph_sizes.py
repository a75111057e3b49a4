"""Which decode batch sizes are captured as CUDA graphs; 0 means none, as the runtime reserve reads it (CPU only)."""

from __future__ import annotations

import pytest
import torch

from app.forward.graphs import decode_graph_batch_sizes
from kvcache.byte_units import GiB, MiB
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.sizing.runtime_reserve import RuntimeShape, decode_cuda_graph_max_bs


def test_sglang_s_capture_list_up_to_the_cap_includes_the_cap() -> None:
    assert decode_graph_batch_sizes(1) == (1,)
    assert decode_graph_batch_sizes(13) == (1, 2, 4, 8, 12, 13)
    assert decode_graph_batch_sizes(24) == (1, 2, 4, 8, 12, 16, 24)
    assert len(decode_graph_batch_sizes(256)) == 36


def test_a_cap_of_zero_captures_no_sizes_and_a_negative_cap_is_refused() -> None:
    assert decode_graph_batch_sizes(0) == ()
    with pytest.raises(ValueError, match="-1"):
        decode_graph_batch_sizes(-1)


@pytest.mark.parametrize("settings", [{"cuda_graph_max_bs": 0}, {"disable_cuda_graph": True}])
def test_no_decode_graphs_captures_nothing_says_so_and_decodes_eagerly(make_engine, settings) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB, max_running_requests=4, **settings)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    args = engine.server_args()
    reserve_bs = decode_cuda_graph_max_bs(80 * GiB, RuntimeShape(
        cuda_graphs=not args.disable_cuda_graph, cuda_graph_max_bs=args.cuda_graph_max_bs))
    capture = runner.capture_decode_graphs()  # no graph to capture: no CUDA device needed
    assert reserve_bs == capture.max_bs == 0 and capture.batch_sizes == ()
    assert capture.bytes_taken == 0 and runner.decode_graphs is None
    assert "no decode CUDA graphs" in capture.summary
    requests = runner.decode_requests()
    batch = requests.step(requests.add(2), torch.tensor([3, 7]))
    assert torch.equal(runner.decode(batch), runner.forward_decode(batch))  # eager: the same step again


def test_an_explicit_cap_of_zero_is_not_read_as_unset(make_engine) -> None:
    engine = make_engine(kv_cache_memory=16 * MiB, max_running_requests=4, cuda_graph_max_bs=4)
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB))
    runner = engine.engine().target
    runner.initialize()
    assert runner.capture_decode_graphs(max_bs=0).batch_sizes == ()
