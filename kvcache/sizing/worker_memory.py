"""WorkerMemory: what a worker's device holds and has free around loading its weights, the readings a plan and
its budget start from (and what the ranks agree on: the smallest of each)."""

from __future__ import annotations

import msgspec

from kvcache.sizing.memory_budget import MemoryBudget


class WorkerMemory(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker's device holds and has free around loading its weights (bytes)."""

    total_bytes: int  # cudaMemGetInfo's total
    free_before_load: int
    free_after_load: int
    reported_total_bytes: int | None = None  # nvidia-smi's total where the card reports one apart from total_bytes

    @property
    def device_capacity_bytes(self) -> int:
        """The card as SGLang 0.5.23's get_device_memory_capacity reads it (nvidia-smi's): what its card-size
        defaults and derived mem_fraction_static read; total_bytes where the card reports one total."""
        return self.total_bytes if self.reported_total_bytes is None else self.reported_total_bytes

    @classmethod
    def of_budget(cls, budget: MemoryBudget) -> "WorkerMemory":
        """The readings a plan's budget was computed from (to plan again for the same memory)."""
        return cls(total_bytes=budget.total_bytes, free_before_load=budget.free_before_load_bytes,
                   free_after_load=budget.free_after_load_bytes, reported_total_bytes=budget.reported_total_bytes)

    @classmethod
    def smallest(cls, memories: "list[WorkerMemory] | tuple[WorkerMemory, ...]") -> "WorkerMemory":
        """What ranks plan with: the smallest of each reading (SGLang's MIN over the ranks)."""
        return cls(total_bytes=min(m.total_bytes for m in memories),
                   free_before_load=min(m.free_before_load for m in memories),
                   free_after_load=min(m.free_after_load for m in memories),
                   reported_total_bytes=min(m.device_capacity_bytes for m in memories))
