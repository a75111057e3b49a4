"""The plan's tensors: every buffer a worker carves from its arena, by name, shape and dtype.

Layer specs (kvcache.sizing.layer_specs) emit the tensors of one row (a token's K/V, latent, indexer
key) or one slot (a request's conv and SSM state); the plan repeats them per layer over its rows, adds
the request table and the allocator's index buffers, and groups them in arena slots: a `PlannedSlot` is
one `slot_size`-rounded stretch of the arena holding its tensors back to back. A buffer's planned bytes
(MemoryPoolConfig.worker_buffers) are the sum of its slots. JSON-encodable: dtypes are torch's names
(kvcache.inputs.dtypes), turned into torch dtypes only where the builder carves them.
"""

from __future__ import annotations

from math import prod

import msgspec

from kvcache.inputs.dtypes import dtype_named
from kvcache.sizing.arena_sizes import slot_size


class PlannedTensor(msgspec.Struct, frozen=True, array_like=True):
    """One tensor: its name, shape, dtype (a torch dtype's name) and bytes. Build it with `tensor()`."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def rows(self, rows: int, name: str) -> "PlannedTensor":
        """This row (or slot) tensor repeated over `rows` rows, named `name`."""
        return PlannedTensor(name, (rows, *self.shape), self.dtype, rows * self.nbytes)


def tensor(name: str, shape: tuple[int, ...], dtype: str) -> PlannedTensor:
    """A planned tensor, its bytes computed from its shape and dtype."""
    return PlannedTensor(name, shape, dtype, prod(shape) * dtype_named(dtype).itemsize)


class PlannedSlot(msgspec.Struct, frozen=True, array_like=True):
    """One slot of a worker's arena: the buffer it belongs to (a name of worker_buffers) and its tensors."""

    buffer: str
    tensors: tuple[PlannedTensor, ...]

    @property
    def nbytes(self) -> int:
        """The slot's share of the arena: its tensors back to back, 512-byte aligned."""
        return slot_size(sum(t.nbytes for t in self.tensors))


def row_bytes(row: tuple[PlannedTensor, ...]) -> int:
    """Bytes of one row (or slot) of these tensors."""
    return sum(t.nbytes for t in row)


def per_layer(prefix: str, layer_ids: tuple[int, ...], row: tuple[PlannedTensor, ...], rows: int) -> tuple[PlannedTensor, ...]:
    """Every layer's tensors of `row` over `rows` rows, layer by layer: `{prefix}.{layer}.{tensor}`."""
    return tuple(t.rows(rows, f"{prefix}.{layer}.{t.name}") for layer in layer_ids for t in row)
