"""Dummy weights: per-rank parameter shapes from a HF config, and the loader that allocates them."""

from app.weights.loader import (
    DummyWeightLoader,
    LoadedWeights,
    QuantizedStorage,
    StoredTensor,
    WeightsDoNotFitError,
    bytes_needed,
    fp8_block_size_for,
    quantized_storage_for,
    storage_of,
)
from app.weights.shapes import ParamSpec, count_parameters, parameter_specs

__all__ = [
    "DummyWeightLoader", "LoadedWeights", "ParamSpec", "QuantizedStorage", "StoredTensor", "WeightsDoNotFitError",
    "bytes_needed", "count_parameters", "fp8_block_size_for", "parameter_specs", "quantized_storage_for", "storage_of",
]
