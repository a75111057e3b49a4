"""Named accelerator cards for dry-run plans, with the capacity their driver reports.

A plan assumes the card's capacity less the CUDA context (`CUDA_CONTEXT_BYTES`) is free
before weights load. Both were measured on an H200 (torch 2.11, driver 580.159,
2026-12-02): cudaMemGetInfo's total was 150,109,880,320 B, and right after torch
created its context 650,969,088 B of it were no longer free. Other cards' capacities
are nvidia-smi's MiB figures; their driver reports a few hundred MiB less.

The context then grows while the first weights load, as the kernels that fill them are
loaded into it: by CUDA_KERNEL_LOAD_BYTES = 96,468,992 B (92 MiB) for every one of ten
presets on an H200 (torch 2.11, driver 580.159, 2026-12-03; benchmarks/RESULTS.md), and
not at all while the KV cache is built. A dry run charges it with the first allocation
(kvcache.memory.memory_probe.FixedMemoryProbe), so it never promises more than a real bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.byte_units import GiB, MiB, parse_bytes
from kvcache.errors import ConfigError

CUDA_CONTEXT_BYTES = 650_969_088
CUDA_KERNEL_LOAD_BYTES = 96_468_992
MAX_CARD_BYTES = 4 << 40  # far above any accelerator's memory (hundreds of GiB today)


@dataclass(frozen=True, slots=True)
class SimulatedCard:
    """A card to plan for: its name, total bytes, and the bytes free before weights load."""

    name: str
    total_bytes: int

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - CUDA_CONTEXT_BYTES)


# Total bytes: H200 as cudaMemGetInfo reported it; the others as nvidia-smi's MiB.
KNOWN_CARDS: dict[str, int] = {
    "H100-80GB": 81559 * MiB,
    "H100-94GB": 95830 * MiB,
    "H200": 150_109_880_320,
    "B200": 183359 * MiB,
    "A100-40GB": 40960 * MiB,
    "A100-80GB": 81920 * MiB,
    "L40S": 46068 * MiB,
    "L4": 23034 * MiB,
    "A10": 23028 * MiB,
    "RTX-4090": 24564 * MiB,
    "RTX-3090": 24576 * MiB,
    "MI300X": 196592 * MiB,
}


def card_named(name: str) -> SimulatedCard:
    for known, total in KNOWN_CARDS.items():
        if known.lower() == name.lower():
            return SimulatedCard(name=known, total_bytes=total)
    close = [known for known in KNOWN_CARDS if known.lower().startswith(name.strip().lower()) and name.strip()]
    meant = f"; did you mean {' or '.join(close)}?" if close else ";"
    raise ConfigError(f"unknown card {name!r}{meant} known: {', '.join(KNOWN_CARDS)}; or give --gpu-memory 80GiB")


def card_of_size(text: str) -> SimulatedCard:
    """A card of the capacity the user typed ('80GB', '80GiB' and '80G' are all 80 GiB: see byte_units)."""
    try:
        total = parse_bytes(text)
    except ValueError as exc:
        raise ConfigError(f"--gpu-memory: {exc}") from None
    if total < GiB // 4:
        raise ConfigError(f"--gpu-memory {text} is smaller than any card (256 MiB); give e.g. 80GiB")
    if total > MAX_CARD_BYTES:
        raise ConfigError(f"--gpu-memory {text} is larger than any card (at most 4 TiB here); give e.g. 80GiB")
    return SimulatedCard(name=f"{text} card", total_bytes=total)
