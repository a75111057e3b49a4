"""Host cost of the device operations an allocator step is built from, on CUDA (issue 10's design input).

What a step costs on the host is the sum of what it launches and what Python does around
it; this prints, per primitive, the microseconds of host wall time per call (the median over
chunks of 200 calls, the device synchronized only between chunks): a slice view, an append
written four ways, a torch.cat of the free list (SGLang's free), an add, an index_copy_, a
pinned host-to-device copy, a trivial Triton launch and our paged decode/extend kernels.

    python benchmarks/gpu_op_costs.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvcache.allocators import paged_kernels  # noqa: E402

CHUNK, CHUNKS = 200, 25


def cost_us(call: Callable[[], object], chunk: int = CHUNK, chunks: int = CHUNKS) -> float:
    """Median host microseconds per call over `chunks` chunks of `chunk` calls."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(chunks):
        start = time.perf_counter()
        for _ in range(chunk):
            call()
        per_call.append((time.perf_counter() - start) / chunk)
        torch.cuda.synchronize()
    return statistics.median(per_call) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--chunk", type=int, default=CHUNK)
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    # cpu: CI's smoke test (torch.cuda faked), without the pinned copies and the kernels, which need CUDA
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    dev = torch.device(ns.device)
    cuda = dev.type == "cuda"
    log = torch.arange(2_000_000, dtype=torch.int64, device=dev)
    ids = torch.arange(256, dtype=torch.int64, device=dev)
    free_list = torch.arange(500_000, dtype=torch.int64, device=dev)
    pinned = torch.empty(256, dtype=torch.int64).pin_memory() if cuda else None
    host = torch.arange(256, dtype=torch.int64)
    index = torch.arange(0, 256, 16, device=dev)
    kernels = paged_kernels.load() if cuda else None
    assert kernels is not None or not cuda
    ps = 16
    seq = (torch.arange(256) * 7 + 129).to(dev)
    last = (torch.arange(256) * 64 + (torch.arange(256) * 7 + 127) % ps).to(dev)
    out = torch.empty(256, dtype=torch.int64, device=dev)
    prefix = torch.tensor([64, 72] * 4, device=dev)
    ext_seq = prefix + 256
    ext_last = torch.arange(8, device=dev) * 640 + (prefix - 1) % ps
    ext_out = torch.empty(2048, dtype=torch.int64, device=dev)

    try:
        import triton
        import triton.language as tl

        @triton.jit
        def nop(x_ptr, n):
            tl.store(x_ptr, n)
        trivial = (lambda: nop[(1,)](out, 3)) if cuda else None  # noqa: E731
    except ImportError:
        trivial = None

    ops: dict[str, Callable[[], object]] = {
        "slice view log[a:b]": lambda: log[1000:1256],
        "narrow view": lambda: log.narrow(0, 1000, 256),
        "append: log[a:b] = ids": lambda: log.__setitem__(slice(600_000, 600_256), ids),
        "append: log[a:b].copy_(ids)": lambda: log[600_000:600_256].copy_(ids),
        "append: log.narrow(...).copy_(ids)": lambda: log.narrow(0, 600_000, 256).copy_(ids),
        "append: torch.mul(ids, 16, out=log[a:b])": lambda: torch.mul(ids, 16, out=log[600_000:600_256]),
        "torch.cat((free_list, ids)) (SGLang's free, 500k free)": lambda: torch.cat((free_list, ids)),
        "torch.empty(256)": lambda: torch.empty(256, dtype=torch.int64, device=dev),
        "ids + 1": lambda: ids + 1,
        "index_copy_ (16 of 256)": lambda: out.index_copy_(0, index, ids[:16]),
        "index_select (16 of 256)": lambda: torch.index_select(ids, 0, index),
        "host: (seq_cpu % 16 == 1) count": lambda: int(torch.count_nonzero(host % 16 == 1)),
    }
    if cuda:
        ops.update({
            "pin_memory() + to(non_blocking)": lambda: host.pin_memory().to(dev, non_blocking=True),
            "persistent pinned -> device copy_": lambda: out.copy_(pinned, non_blocking=True),
            "our decode kernel (256 requests)": lambda: kernels.alloc_decode(seq, last, log, 5000, out, ps),
            "our extend kernel (8 x 256 tokens)": lambda: kernels.alloc_extend(prefix, ext_seq, ext_last, log, 5000,
                                                                             ext_out, ps),
        })
    if trivial is not None:
        ops["trivial Triton launch (2 args)"] = trivial
    results = {name: round(cost_us(call, ns.chunk, ns.chunks), 2) for name, call in ops.items()}
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    for name, value in results.items():
        print(f"{value:8.2f} us  {name}")
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
