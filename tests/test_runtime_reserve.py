"""SGLang 0.5.23's derived mem_fraction_static, by card: every number worked by hand from the rule.

reserve = 512 + 1.5 * max(chunk, 2048) + tp * pp / 8 * 1024 + 2 * bs + 8 * len(prefill graph sizes)
(1536 for MLA instead of the last term) [+ DP terms]; >= 10,240 above 60 GiB; all in MiB.
The same values came out of SGLang 0.5.23's own handle_gpu_memory_settings (card size stubbed).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from kvcache.byte_units import GiB, MiB
from kvcache.inputs.cards import KNOWN_CARDS
from kvcache.sizing.runtime_reserve import (
    RuntimeShape, decode_cuda_graph_max_bs,
    decode_graph_batch_cap, default_chunked_prefill_size, default_cuda_graph_max_bs,
    default_mem_fraction_static, prefill_cuda_graph_count, runtime_reserve_mib,
)

CUDA = RuntimeShape(cuda_graphs=True)


@pytest.mark.parametrize(
    ("card", "reserve", "fraction"),
    [
        # L4, 23,034 MiB: chunk 4,096, bs 48, 50 prefill sizes: 512 + 6,144 + 128 + 96 + 400 = 7,280;
        # 15,754 / 23,034 = 0.68395 -> 0.684 (the old rule's chunk 2,048 / bs 24 gave 0.837)
        ("L4", 7280, 0.684),
        ("A10", 7280, 0.684),  # 23,028 MiB: 15,748 / 23,028 = 0.68386
        ("RTX-4090", 7280, 0.704),  # 24,564 MiB: 17,284 / 24,564 = 0.70363 (the old rule: 0.847)
        # A100-40GB, 40,960 MiB: chunk 4,096, bs 32: 512 + 6,144 + 128 + 64 + 400 = 7,248; 33,712 / 40,960 = 0.82305
        ("A100-40GB", 7248, 0.823),
        # H100-80GB, 81,559 MiB: chunk 8,192, bs 256, 58 prefill sizes: 512 + 12,288 + 128 + 512 + 464 = 13,904;
        # 67,655 / 81,559 = 0.82952 -> 0.830
        ("H100-80GB", 13904, 0.830),
        # H200 as nvidia-smi reports it (SGLang's get_device_memory_capacity), 143,771 MiB: 129,867 / 143,771 = 0.90329
        # -> 0.903 (cudaMemGetInfo's 143,155.875 MiB gives 0.90287, the same after rounding here)
        ("H200", 13904, 0.903),
        # B200, 183,359 MiB: chunk 16,384, bs 512, 74 sizes: 512 + 24,576 + 128 + 1,024 + 592 = 26,832; 0.85366
        ("B200", 26832, 0.854),
    ],
)
def test_named_cards_at_tp1(card: str, reserve: int, fraction: float) -> None:
    total = KNOWN_CARDS[card].nvidia_smi_bytes  # the total SGLang's rule reads
    assert runtime_reserve_mib(total, CUDA) == reserve
    assert default_mem_fraction_static(total, CUDA) == fraction


@pytest.mark.parametrize(
    ("mib", "shape", "reserve", "fraction"),
    [
        # TP4 on an L4: bs 160, tp term 512: 512 + 6,144 + 512 + 320 + 400 = 7,888; 15,146 / 23,034 = 0.65755
        (23034, RuntimeShape(cuda_graphs=True, tp_size=4), 7888, 0.658),
        # MLA keeps 1,536 for prefill graphs: DeepSeek on an H200 at TP8: 512 + 12,288 + 1,024 + 1,024 + 1,536
        (Fraction(150_109_880_320, MiB), RuntimeShape(cuda_graphs=True, tp_size=8, uses_mla=True), 16384, 0.886),
        # PP > 1 captures no prefill graphs: 512 + 12,288 + 256 + 512 = 13,568; 67,991 / 81,559 = 0.83364
        (81559, RuntimeShape(cuda_graphs=True, pp_size=2), 13568, 0.834),
        # no CUDA graphs: 512 + 12,288 + 128 = 12,928; 68,631 / 81,559 = 0.84149
        (81559, RuntimeShape(cuda_graphs=False), 12928, 0.841),
        # --max-running-requests 16 caps the default decode batch: 2 x 16 = 32 instead of 96; 0.68672
        (23034, RuntimeShape(cuda_graphs=True, max_running_requests=16), 7216, 0.687),
        # ... but not a batch the user gave
        (23034, RuntimeShape(cuda_graphs=True, max_running_requests=16, cuda_graph_max_bs=48), 7280, 0.684),
        # --max-total-tokens 1,000 caps prefill graphs at 1,000 tokens: 37 sizes, 296 MiB; 15,858 / 23,034 = 0.68846
        (23034, RuntimeShape(cuda_graphs=True, max_total_tokens=1000), 7176, 0.688),
        # DP attention, TP8 x DP8 on 80 GiB: 15,312 + 3 x 512 x 8 + 1.5 x 512 x 8 (bs > 300) = 33,744; 0.58809
        (81920, RuntimeShape(cuda_graphs=True, tp_size=8, attention_dp_size=8), 33744, 0.588),
        # the same without decode graphs: SGLang still sets decode max_bs 512, which its DP term reads (the decode
        # term 2 x 512 goes): 33,744 - 1,024 = 32,720; with no graphs at all the prefill graphs' 8 x 58 go too
        (81920, RuntimeShape(cuda_graphs=True, decode_cuda_graphs=False, tp_size=8, attention_dp_size=8), 32720,
         0.601),
        (81920, RuntimeShape(cuda_graphs=False, tp_size=8, attention_dp_size=8), 32720 - 8 * 58, 0.606),
        # bs 256 (<= 300): 512 + 12,288 + 1,024 + 512 + 464 + 3 x 256 x 4 = 17,872; 64,048 / 81,920 = 0.78184
        (81920, RuntimeShape(cuda_graphs=True, tp_size=8, attention_dp_size=4, cuda_graph_max_bs=256), 17872, 0.782),
        # the 10 GiB floor above 60 GiB: 512 + 3,072 + 128 + 16 + 336 = 4,064 -> 10,240; 71,680 / 81,920 = 0.875
        (81920, RuntimeShape(cuda_graphs=True, chunked_prefill_size=2048, cuda_graph_max_bs=8), 10240, 0.875),
        # exactly 60 GiB is not above it: 4,064 stays; 57,376 / 61,440 = 0.93385
        (61440, RuntimeShape(cuda_graphs=True, chunked_prefill_size=2048, cuda_graph_max_bs=8), 4064, 0.934),
        # a CPU engine within 8 GiB: no graphs, chunk 2,048: 512 + 3,072 + 128 = 3,712; 4,480 / 8,192 = 0.546875
        (8192, RuntimeShape(cuda_graphs=False), 3712, 0.547),
    ],
)
def test_reserve_terms(mib: int | Fraction, shape: RuntimeShape, reserve: int, fraction: float) -> None:
    total = int(mib * MiB)
    assert runtime_reserve_mib(total, shape) == reserve
    assert default_mem_fraction_static(total, shape) == fraction


@pytest.mark.parametrize(
    ("mib", "chunk", "bs_tp1", "bs_tp4"),
    [(16 * 1024, 2048, 8, 8), (20 * 1024 - 1, 2048, 8, 8), (20 * 1024, 4096, 48, 160), (35 * 1024 - 1, 4096, 48, 160),
     (35 * 1024, 4096, 32, 160), (60 * 1024 - 1, 4096, 32, 160), (60 * 1024, 8192, 256, 512),
     (160 * 1024 - 1, 8192, 256, 512), (160 * 1024, 16384, 512, 512)],
)
def test_card_size_defaults_switch_at_sglangs_thresholds(mib: int, chunk: int, bs_tp1: int, bs_tp4: int) -> None:
    assert default_chunked_prefill_size(mib * MiB) == chunk
    assert (default_cuda_graph_max_bs(mib * MiB, 1), default_cuda_graph_max_bs(mib * MiB, 4)) == (bs_tp1, bs_tp4)
    assert default_cuda_graph_max_bs(mib * MiB + 1, 3) == bs_tp1  # tp 3 is still "below 4"


@pytest.mark.parametrize(("max_tokens", "count"), [(3, 0), (4, 1), (7, 1), (8, 2), (32, 8), (47, 8), (48, 9), (1000, 37),
                                                   (2048, 42), (4096, 50), (4607, 50), (4608, 51), (8192, 58), (16384, 74),
                                                   (10**17, 50 + (10**17 - 4608) // 512 + 1)])
def test_prefill_graph_count(max_tokens: int, count: int) -> None:
    # SGLang's own generate_prefill_cuda_graph_batch_sizes gave 0, 1, 37, 42, 50, 58, 74 for 3 ... 16,384
    assert prefill_cuda_graph_count(max_tokens) == count


def test_no_graphs_means_no_graph_batch() -> None:
    assert decode_cuda_graph_max_bs(80 * GiB, RuntimeShape(cuda_graphs=False, cuda_graph_max_bs=64)) == 0
    assert decode_cuda_graph_max_bs(80 * GiB, RuntimeShape(cuda_graphs=True, cuda_graph_max_bs=64)) == 64
    no_decode = RuntimeShape(cuda_graphs=True, decode_cuda_graphs=False, cuda_graph_max_bs=64)
    assert decode_cuda_graph_max_bs(80 * GiB, no_decode) == 0 and decode_graph_batch_cap(80 * GiB, no_decode) == 64
    assert decode_graph_batch_cap(80 * GiB, RuntimeShape(cuda_graphs=False, decode_graph_cap_set=False)) == 0
