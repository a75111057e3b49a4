"""Dummy weights: per-rank parameter shapes from a HF config, their bytes, and the loader that allocates them.

The loader makes tensors, so torch is imported when it is first asked for, not for a shape or a byte count
(`plan` and `fit` count weights without a device).
"""

from typing import Any

from app.weights.shapes import ParamSpec, count_parameters, parameter_specs, rank_parameter_specs
from app.weights.storage import StoredTensor, bytes_needed, storage_of

_LOADER_NAMES = ("DummyWeightLoader", "LoadedWeights", "WeightsDoNotFitError")

__all__ = [
    "DummyWeightLoader", "LoadedWeights", "ParamSpec", "StoredTensor", "WeightsDoNotFitError",
    "bytes_needed", "count_parameters", "parameter_specs", "rank_parameter_specs", "storage_of",
]


def __getattr__(name: str) -> Any:
    """The loader's names, imported (with torch) on first use."""
    if name in _LOADER_NAMES:
        from app.weights import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'app.weights' has no attribute {name!r}")
