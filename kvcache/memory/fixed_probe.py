"""FixedMemoryProbe: a simulated card for dry runs and tests. Plain integers, no device (so `fit` needs no torch)."""

from __future__ import annotations

from kvcache.errors import ConfigError
from kvcache.inputs.cards import CUDA_KERNEL_LOAD_BYTES, SimulatedCard


class FixedMemoryProbe:
    """A simulated card: fixed total, free bytes that fall only by what is noted.

    `first_allocation_overhead` is charged once, with the first allocation noted: on a
    CUDA card the context grows by the kernels that load while weights are filled
    (kvcache.inputs.cards.CUDA_KERNEL_LOAD_BYTES), and a dry run must see that too.
    """

    def __init__(self, *, total_bytes: int, free_bytes: int | None = None, first_allocation_overhead: int = 0,
                 device_capacity_bytes: int | None = None) -> None:
        free = total_bytes if free_bytes is None else free_bytes
        if total_bytes <= 0 or not 0 <= free <= total_bytes or first_allocation_overhead < 0:
            raise ConfigError(f"a simulated card needs 0 <= free ({free}) <= total ({total_bytes}) and total > 0")
        self._total = total_bytes
        self._capacity = total_bytes if device_capacity_bytes is None else device_capacity_bytes  # one total given
        self._free = free
        self._overhead = first_allocation_overhead

    @classmethod
    def of_card(cls, card: SimulatedCard) -> "FixedMemoryProbe":
        """The card a dry run plans for (`plan --gpu`), its context growing by the kernels weights load."""
        return cls(total_bytes=card.total_bytes, free_bytes=card.free_bytes,
                   device_capacity_bytes=card.device_capacity_bytes, first_allocation_overhead=CUDA_KERNEL_LOAD_BYTES)

    def free_bytes(self) -> int:
        return self._free

    def total_bytes(self) -> int:
        return self._total

    def device_capacity_bytes(self) -> int:
        return self._capacity

    def note_allocation(self, nbytes: int) -> None:
        self._free = max(0, self._free - nbytes - self._overhead)
        self._overhead = 0

    def __repr__(self) -> str:
        return f"FixedMemoryProbe(total_bytes={self._total}, free_bytes={self._free})"
