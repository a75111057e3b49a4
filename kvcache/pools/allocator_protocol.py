"""TokenAllocator: what the configurator and the pool builder need of any KV token allocator.

Token, paged and SWA allocators all satisfy it (as does kvcache.testing.RecordingAllocator);
an `AllocatorFactory` builds one from the plan, so a container can provide the factory
and a test can swap it. Index operations (alloc, free, backup) are the scheduler's
business and are not part of this protocol. It lives with the builder that consumes it, one floor
below the allocators that satisfy it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from kvcache.sizing.pool_config import MemoryPoolConfig


@runtime_checkable
class TokenAllocator(Protocol):
    """Hands out KV token indices 1..size in pages of page_size; size and nbytes are its planned slots'
    (MemoryPoolConfig.allocator_slots, read by the allocator) and nbytes what they take of an arena."""

    @property
    def size(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def check_frees(self) -> bool:
        """Whether it checks every free id by id (its plan has the is_free flags): a resize asks the same of the
        allocator it builds to replace it."""
        ...

    def available_size(self) -> int: ...

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Its device buffers by the plan's names (`allocator.free_log.0`, ...), which the builder checks."""
        ...


class AllocatorFactory(Protocol):
    """Builds the allocator a plan calls for (its sizes and tensors are the plan's allocator slots); `kvcache` is the
    attention KV pool it addresses, or None when that pool is built after it (a hybrid SWA pool needs the
    allocator's map: the builder then calls the allocator's attach_kvcache). `views` are the builder's carve of
    the plan's tensors by name (the allocator's `allocator.*` among them); None: it allocates its own.
    `check_frees`: check every free id by id (a resize asks for what the allocator it replaces did)."""

    def __call__(self, *, plan: "MemoryPoolConfig", device: torch.device, kvcache: Any = None,
                 views: "Mapping[str, torch.Tensor] | None" = None, check_frees: bool = False) -> TokenAllocator: ...
