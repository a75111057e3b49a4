"""Dummy weights: parameter shapes from a HF config, and the loader that allocates them."""

from app.weights.loader import DummyWeightLoader, LoadedWeights, WeightsDoNotFitError, bytes_needed, quantized_storage_for
from app.weights.shapes import ParamSpec, count_parameters, parameter_specs

__all__ = ["DummyWeightLoader", "LoadedWeights", "ParamSpec", "WeightsDoNotFitError", "bytes_needed",
           "count_parameters", "parameter_specs", "quantized_storage_for"]
