"""Dummy weights: per-rank parameter shapes from a HF config, and the loader that allocates them."""

from app.weights.loader import (
    DummyWeightLoader,
    LoadedWeights,
    StoredTensor,
    WeightsDoNotFitError,
    bytes_needed,
    storage_of,
)
from app.weights.shapes import ParamSpec, count_parameters, parameter_specs

__all__ = [
    "DummyWeightLoader", "LoadedWeights", "ParamSpec", "StoredTensor", "WeightsDoNotFitError",
    "bytes_needed", "count_parameters", "parameter_specs", "storage_of",
]
