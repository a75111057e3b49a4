"""Named accelerator cards for dry-run plans, with the capacity their driver reports.

A plan assumes the card's whole capacity less the CUDA context (`CUDA_CONTEXT_BYTES`,
measured on an H200 with torch: the free bytes cudaMemGetInfo reports right after the
context is created, before any allocation) is free before weights load.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.byte_units import GiB, MiB, parse_bytes
from kvcache.errors import ConfigError

CUDA_CONTEXT_BYTES = 512 * MiB


@dataclass(frozen=True, slots=True)
class SimulatedCard:
    """A card to plan for: its name, total bytes, and the bytes free before weights load."""

    name: str
    total_bytes: int

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - CUDA_CONTEXT_BYTES)


# Capacities as cudaMemGetInfo reports them (MiB as nvidia-smi shows them).
KNOWN_CARDS: dict[str, int] = {
    "H100-80GB": 81559 * MiB,
    "H100-94GB": 95830 * MiB,
    "H200": 143771 * MiB,
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
    raise ConfigError(f"unknown card {name!r}; known: {', '.join(KNOWN_CARDS)}; or give --gpu-memory 80GiB")


def card_of_size(text: str) -> SimulatedCard:
    total = parse_bytes(text)
    if total < GiB // 4:
        raise ConfigError(f"--gpu-memory {text} is smaller than any card (256 MiB); give e.g. 80GiB")
    return SimulatedCard(name=f"{text} card", total_bytes=total)
