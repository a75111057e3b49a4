"""kvcache: size an LLM engine's KV cache from a model config and a memory budget, then build it.

The domain package: plain Python, torch and msgspec. It never imports
dependency_injector, app or containers (see DESIGN.md). One folder per stage, in the order
start-up runs them: inputs, models, memory, sizing, pools, allocators, runtime; the configurator
on top, the ground floor (errors, arithmetic, byte_units) below (README's Layout says what each holds;
tests/test_import_floors.py keeps imports flowing down).
"""

import warnings

# torch warns at import when NumPy is absent or built for another ABI ("Failed to initialize NumPy: ..."); nothing here
# hands tensors to NumPy, so the warning is noise in a library, under pytest and under torchrun's ranks. Installed
# before any module of this package imports torch; torchrun's own launcher process imports torch before us.


def silence_torch_numpy_warning() -> None:
    """Install the one filter that drops torch's NumPy warning (only that message, only a UserWarning)."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


silence_torch_numpy_warning()
