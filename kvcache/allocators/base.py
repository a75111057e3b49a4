"""FreeListAllocator: what the token and paged allocators share (frees, free groups, clear, backup).

Both keep one FreeStack of ids (token indices, or page numbers) and differ only in
how an id maps to token indices; subclasses say that through `_release`.
Meta-device allocators construct, report sizes and back up, but refuse to hand out
or take back indices: a meta tensor has no values, so any index it "held" would be
a lie. A dry run goes through construction (and its byte count) and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache.allocators.free_group import FreeGroup, FreeGroupState
from kvcache.allocators.free_stack import FreeStack, FreeStackState


@dataclass(frozen=True, slots=True)
class AllocatorState:
    """An opaque backup of a token or paged allocator: its free list and its free group."""

    free_list: FreeStackState
    free_group: FreeGroupState


def reject_meta(device: torch.device, op: str) -> None:
    """Raise ValueError for index operations on a meta allocator (see the module docstring)."""
    if device.type == "meta":
        raise ValueError(
            f"{op}() on a meta-device allocator: meta tensors hold no values, so it has no real "
            "indices to hand out or take back; build the allocator on cpu or cuda"
        )


def as_indices(indices: torch.Tensor, device: torch.device, what: str) -> torch.Tensor:
    """indices as a flat int64 tensor on device (themselves when they already are: the hot path)."""
    if indices.dtype == torch.int64 and indices.dim() == 1 and indices.device == device:
        return indices
    if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
        raise ValueError(f"{what} must be an integer tensor, got dtype {indices.dtype}")
    return indices.reshape(-1).to(device=device, dtype=torch.int64)


def check_need_size(need_size: int, page_size: int) -> None:
    """Raise ValueError unless need_size is a non-negative multiple of page_size."""
    if need_size < 0:
        raise ValueError(f"need_size must be >= 0, got {need_size}")
    if need_size % page_size:
        raise ValueError(f"need_size {need_size} is not a multiple of page_size {page_size}")


class FreeListAllocator:
    """SGLang's allocator API over one FreeStack of ids, each id standing for page_size tokens."""

    def __init__(self, *, capacity: int, page_size: int, device: torch.device | str, check_frees: bool, unit: str) -> None:
        self._device = torch.device(device)
        self._page_size = page_size
        self._checking = check_frees
        self._stack = FreeStack(capacity=capacity, device=self._device, unit=unit, check=check_frees)
        self._group = FreeGroup()

    @property
    def size(self) -> int:
        """Usable tokens (the pool has page_size more rows: the padding page)."""
        return self._stack.capacity * self._page_size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def nbytes(self) -> int:
        """Device bytes of the index buffers (kvcache.allocators.footprint states the formula)."""
        return self._stack.nbytes

    def available_size(self) -> int:
        """Free tokens."""
        return self._stack.available * self._page_size

    def free(self, free_index: torch.Tensor) -> None:
        """Give back token indices; inside a free group they are released at free_group_end()."""
        if free_index.numel() == 0:
            return
        reject_meta(self._device, "free")
        indices = as_indices(free_index, self._device, "free_index")
        if not self._group.defer(indices):
            self._release(indices)

    def _release(self, indices: torch.Tensor) -> None:
        raise NotImplementedError

    def free_group_begin(self) -> None:
        self._group.begin()

    def free_group_end(self) -> None:
        indices = self._group.end()
        if indices is not None:
            self._release(indices)

    def clear(self) -> None:
        """Everything free again and any free group closed; earlier backups become void."""
        self._group.close()
        self._stack.reset()

    def backup_state(self) -> AllocatorState:
        """O(1). Only the latest backup can be restored."""
        return AllocatorState(free_list=self._stack.backup(), free_group=self._group.mark())

    def restore_state(self, state: AllocatorState) -> None:
        """Free set and free group as at backup; costs what changed since, not the pool size."""
        self._stack.restore(state.free_list)
        self._group.restore(state.free_group)
