"""What holds a model's weights, in bytes: the tensors of each parameter and the one arena they are carved from.

Plain arithmetic over shapes and dtypes (no torch): `plan` and `fit` count the weights with it, and the loader
(app.weights.loader) allocates exactly what it counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcache.inputs.dtypes import DType
from kvcache.sizing.arena_sizes import arena_size, slot_size
from kvcache.models.quantization import Quantization, StoredTensor
from kvcache.models.weight_blocks import ParamSpec

NO_QUANTIZATION = Quantization()


def storage_of(spec: ParamSpec, dtype: DType, quantization: Quantization = NO_QUANTIZATION) -> tuple[StoredTensor, ...]:
    """The tensors that hold one parameter: the quantization format's, or one tensor in `dtype`."""
    return quantization.stored(spec, dtype)


def stored_tensors(specs: Sequence[ParamSpec], dtype: DType, quantization: Quantization) -> list[StoredTensor]:
    """Every tensor that holds these parameters, parameter by parameter."""
    return [t for spec in specs for t in storage_of(spec, dtype, quantization)]


def arena_bytes(stored: Sequence[StoredTensor]) -> int:
    """The one arena that holds these tensors, each in its aligned slot."""
    return arena_size(sum(slot_size(t.nbytes) for t in stored))


def bytes_needed(specs: Sequence[ParamSpec], dtype: DType, quantization: Quantization = NO_QUANTIZATION) -> int:
    """Exact bytes `load` will allocate for these specs, scales included: the one arena."""
    return arena_bytes(stored_tensors(specs, dtype, quantization))
