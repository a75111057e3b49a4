"""CUDA-graph capture of the decode step for SGLang's batch sizes, on one memory pool.

Inputs live in static buffers sized for the largest batch; a graph per batch size is
captured largest first, all sharing one graph memory pool (what SGLang does). A batch
replays the smallest captured size that holds it; the padding entries use request row
0 and KV row 0 (both padding), so they read and write nothing real.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from app.forward.batch import DecodeBatch


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every capture on `device` runs on, for the life of the process. cuBLAS keeps a workspace
    per stream it has run on (32 MiB on Hopper) until the process ends: a fresh stream per capture left one behind
    for every start, so a start that failed after capture left 32 MiB allocated (seen on an H200)."""
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def decode_graph_batch_sizes(max_bs: int) -> tuple[int, ...]:
    """SGLang 0.5.23's decode capture list (no speculative decoding), up to and including max_bs;
    none for 0 (--cuda-graph-max-bs 0: no decode graphs, as the runtime reserve reads it)."""
    if max_bs < 0:
        raise ValueError(f"the largest decode graph batch is 0 (no graphs) or more, not {max_bs}")
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs and max_bs not in sizes:
        sizes.append(max_bs)
    return tuple(sizes)


@dataclass(frozen=True, slots=True)
class GraphCapture:
    """What capture took: free device memory before and after (bytes), seconds, and the sizes captured."""

    batch_sizes: tuple[int, ...]
    free_before_bytes: int
    free_after_bytes: int
    seconds: float

    @property
    def bytes_taken(self) -> int:
        return self.free_before_bytes - self.free_after_bytes

    @property
    def max_bs(self) -> int:
        return max(self.batch_sizes, default=0)

    @property
    def summary(self) -> str:
        """One line for the operator: what was captured, or that decode runs eagerly."""
        if not self.batch_sizes:
            return "no decode CUDA graphs (--cuda-graph-max-bs 0 or --disable-cuda-graph): every decode step runs eagerly"
        return (f"{len(self.batch_sizes)} decode CUDA graphs, batch sizes {self.batch_sizes[0]}..{self.max_bs}: "
                f"{self.bytes_taken:,} B in {self.seconds:.1f} s")


class DecodeGraphs:
    """Captured decode graphs over static input buffers; `replay(batch)` returns float32 logits [bs, vocab]."""

    def __init__(self, *, forward: Callable[[DecodeBatch], torch.Tensor], device: torch.device, max_bs: int) -> None:
        self.forward = forward
        self.device = device
        self.max_bs = max_bs
        z = dict(device=device)
        self._ids = torch.zeros(max_bs, dtype=torch.int64, **z)
        self._positions = torch.zeros(max_bs, dtype=torch.int64, **z)
        self._rows = torch.zeros(max_bs, dtype=torch.int64, **z)
        self._seq_lens = torch.ones(max_bs, dtype=torch.int32, **z)
        self._loc = torch.zeros(max_bs, dtype=torch.int64, **z)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: torch.Tensor | None = None  # one static output: graphs copy their logits into it
        self._pool = None

    def _static(self, bs: int) -> DecodeBatch:
        return DecodeBatch(input_ids=self._ids[:bs], positions=self._positions[:bs], req_pool_indices=self._rows[:bs],
                           seq_lens=self._seq_lens[:bs], out_cache_loc=self._loc[:bs])

    def capture(self, batch_sizes: tuple[int, ...], free_bytes: Callable[[], int]) -> GraphCapture:
        """Warm up and capture every size, largest first, on one graph pool; measure what it took."""
        torch.cuda.synchronize(self.device)
        before = free_bytes()
        start = time.perf_counter()
        self._pool = torch.cuda.graph_pool_handle()
        stream = capture_stream(self.device)
        for bs in sorted(batch_sizes, reverse=True):
            batch = self._static(bs)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile kernels and settle the allocator outside the capture
                    warm = self.forward(batch)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            if self._logits is None:
                self._logits = torch.empty(self.max_bs, *warm.shape[1:], dtype=warm.dtype, device=self.device)
            del warm
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                self._logits[:bs].copy_(self.forward(batch))
            self._graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        return GraphCapture(batch_sizes=tuple(sorted(self._graphs)), free_before_bytes=before,
                            free_after_bytes=free_bytes(), seconds=seconds)

    def holds(self, batch_size: int) -> bool:
        """Whether a captured graph is large enough for a batch of batch_size."""
        return any(size >= batch_size for size in self._graphs)

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        """Copy the batch into the static buffers (padding the rest) and replay the smallest graph that holds it."""
        bs = batch.batch_size
        fits = [size for size in self._graphs if size >= bs]
        if not fits:
            raise ValueError(f"batch of {bs} is larger than the largest captured graph ({max(self._graphs, default=0)})")
        size = min(fits)
        for buffer, value, pad in ((self._ids, batch.input_ids, 0), (self._positions, batch.positions, 0),
                                   (self._rows, batch.req_pool_indices, 0), (self._seq_lens, batch.seq_lens, 1),
                                   (self._loc, batch.out_cache_loc, 0)):
            buffer[:bs].copy_(value)
            buffer[bs:size].fill_(pad)
        self._graphs[size].replay()
        assert self._logits is not None
        return self._logits[:bs]
