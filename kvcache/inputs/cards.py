"""Named accelerator cards for dry-run plans, with each total their driver reports, as each engine reads it.

A card reports two totals. nvidia-smi's memory.total (NVML, whole MiB) is what SGLang 0.5.23's
get_device_memory_capacity reads for its card-size defaults (prefill chunk, decode graph batch) and its derived
mem_fraction_static. cudaMemGetInfo's total is smaller by what the driver keeps for itself: it is what the budget's
free memory comes from (free before load = that total less the CUDA context) and what vLLM 0.34 multiplies by
--gpu-memory-utilization. `CardTotals` holds both, one field each; where cudaMemGetInfo's total has not been
measured on the card, nvidia-smi's stands in for it (`cuda_total_measured` False; it then overstates what
cudaMemGetInfo reports by the driver's reserve, 644,939,776 B (615.06 MiB) on the H200). A measurement is added
by filling the card's `cuda_total_bytes` and `cuda_total_source`.

The H200 was measured (torch 2.11, driver 580.159, 2026-12-02): cudaMemGetInfo's total was 150,109,880,320 B, and
right after torch created its context 650,969,088 B of it were no longer free (`CUDA_CONTEXT_BYTES`). nvidia-smi's
totals are the MiB figures nvidia-smi prints for each card (H200 143,771 MiB, H100 80GB 81,559 MiB, L40S 46,068 MiB, ...).

The context then grows while the first weights load, as the kernels that fill them are
loaded into it: by CUDA_KERNEL_LOAD_BYTES = 96,468,992 B (92 MiB) for every one of ten
presets on an H200 (torch 2.11, driver 580.159, 2026-12-03; benchmarks/RESULTS.md), and
not at all while the KV cache is built. A dry run charges it with the first allocation
(kvcache.memory.memory_probe.FixedMemoryProbe), so on a card whose cudaMemGetInfo total is measured it never
promises more than a real bootstrap (where nvidia-smi's stands in, free memory is overstated by the driver's reserve).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.byte_units import GiB, MiB, parse_bytes
from kvcache.errors import ConfigError

CUDA_CONTEXT_BYTES = 650_969_088
CUDA_KERNEL_LOAD_BYTES = 96_468_992
MAX_CARD_BYTES = 4 << 40  # far above any accelerator's memory (hundreds of GiB today)


@dataclass(frozen=True, slots=True)
class CardTotals:
    """One card's totals: nvidia-smi's (SGLang's fraction reads it) and cudaMemGetInfo's where measured."""

    nvidia_smi_mib: int  # `nvidia-smi --query-gpu=memory.total`: SGLang 0.5.23's get_device_memory_capacity
    cuda_total_bytes: int | None = None  # cudaMemGetInfo's total, measured on the card; None: not measured yet
    cuda_total_source: str = ""  # where the measurement comes from (card, torch, driver, date)

    @property
    def nvidia_smi_bytes(self) -> int:
        return self.nvidia_smi_mib * MiB

    @property
    def cuda_total_measured(self) -> bool:
        return self.cuda_total_bytes is not None

    @property
    def budget_total_bytes(self) -> int:
        """cudaMemGetInfo's total: measured, or nvidia-smi's standing in for it (see the module's docstring)."""
        return self.cuda_total_bytes if self.cuda_total_bytes is not None else self.nvidia_smi_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedCard:
    """A card to plan for: its name, its totals as cudaMemGetInfo and nvidia-smi report them, and the bytes free
    before weights load."""

    name: str
    total_bytes: int  # cudaMemGetInfo's (the budget's; vLLM's utilization multiplies it)
    device_capacity_bytes: int  # nvidia-smi's (SGLang 0.5.23's get_device_memory_capacity: its fraction's card)
    cuda_total_measured: bool = True  # False: nvidia-smi's total stands in for an unmeasured cudaMemGetInfo total

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - CUDA_CONTEXT_BYTES)


H200_MEASURED = "H200, torch 2.11, driver 580.159, 2026-12-02"
H100_MEASURED = "H100 80GB HBM3, torch 2.11, driver 580.159, 2026-12-06 (benchmarks/RESULTS.md)"

# nvidia-smi's MiB per card, and cudaMemGetInfo's total where it was measured (the lead's GPU runs fill the others)
KNOWN_CARDS: dict[str, CardTotals] = {
    "H100-80GB": CardTotals(81559, cuda_total_bytes=85_017_493_504, cuda_total_source=H100_MEASURED),
    "H100-94GB": CardTotals(95830),
    "H200": CardTotals(143771, cuda_total_bytes=150_109_880_320, cuda_total_source=H200_MEASURED),
    "B200": CardTotals(183359),
    "A100-40GB": CardTotals(40960),
    "A100-80GB": CardTotals(81920),
    "L40S": CardTotals(46068),
    "L4": CardTotals(23034),
    "A10": CardTotals(23028),
    "RTX-4090": CardTotals(24564),
    "RTX-3090": CardTotals(24576),
    "MI300X": CardTotals(196592),
}


def card_named(name: str) -> SimulatedCard:
    for known, totals in KNOWN_CARDS.items():
        if known.lower() == name.lower():
            return SimulatedCard(name=known, total_bytes=totals.budget_total_bytes,
                                 device_capacity_bytes=totals.nvidia_smi_bytes,
                                 cuda_total_measured=totals.cuda_total_measured)
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
    return SimulatedCard(name=f"{text} card", total_bytes=total, device_capacity_bytes=total)  # one size given: both
