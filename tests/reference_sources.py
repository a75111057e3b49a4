"""The reference engines' source tree for the tests that run SGLang's or vLLM's own code beside ours.

Named by KVCACHE_REFERENCE_SRC (benchmarks/reference_tree.py, the one home of that name); without it,
or without the file a test needs under it, the test skips with a reason the CI skip policy allows.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
COMPILED = ("numpy", "triton", "torch")  # libraries with compiled parts: they cannot be imported twice, so they stay

_SPEC = importlib.util.spec_from_file_location(
    "benchmarks_reference_tree", Path(__file__).resolve().parents[1] / "benchmarks" / "reference_tree.py")
assert _SPEC is not None and _SPEC.loader is not None
_benchmarks_reference_tree = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_benchmarks_reference_tree)
REFERENCE_SRC_ENV: str = _benchmarks_reference_tree.REFERENCE_SRC_ENV


def reference_src_holding(relative_file: str, engine: str) -> Path:
    """The reference tree when it holds `relative_file`; else skip, saying which engine's tree is missing."""
    root = _benchmarks_reference_tree.reference_src_from_env()
    if root is None:
        pytest.skip(f"no {engine} reference tree (set {REFERENCE_SRC_ENV} to a folder holding its sources)")
    if not (root / relative_file).is_file():
        pytest.skip(f"no {engine} reference tree at {root} ({relative_file} is missing)")
    return root


@contextlib.contextmanager
def benchmarks_importable() -> Iterator[None]:
    """benchmarks/ importable by name (its scripts import each other) for the block; afterwards the path, the import
    finders and every module imported meanwhile (the scripts, the reference engines' stand-ins) are as they were,
    except the compiled libraries (COMPILED)."""
    finders, modules, path = list(sys.meta_path), set(sys.modules), list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield
    finally:
        sys.path[:] = path
        sys.meta_path[:] = finders
        for name in set(sys.modules) - modules:
            if name.split(".")[0] not in COMPILED:
                del sys.modules[name]
