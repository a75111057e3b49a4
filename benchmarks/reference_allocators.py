"""Load SGLang 0.5.23's real allocators and vLLM 0.34.0's real BlockPool from their source files, nothing more.

Importing `sglang.srt.mem_cache.allocator` or `vllm.v1.core.block_pool` the normal way
pulls in each project's whole runtime (psutil, zmq, transformers, ...). The benchmark
only needs a few modules, so this loader executes exactly those files from an
installed (or copied) source tree under their real module names, and puts small
stand-ins in sys.modules for the helpers they import: package __init__s, loggers,
platform flags, event classes. The measured code -- SGLang's allocator classes and
Triton kernels, vLLM's BlockPool and its free-block queue -- is the projects' own.

    root = Path(".../site-packages")          # holds sglang/ and vllm/
    sglang = load_sglang(root, use_triton=True)  # .TokenToKVPoolAllocator, .PagedTokenToKVPoolAllocator
    BlockPool = load_vllm_block_pool(root)
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

SGLANG_FILES = {
    "sglang.kernels.ops.memory.allocator": "sglang/kernels/ops/memory/allocator.py",
    "sglang.srt.mem_cache.allocator.base": "sglang/srt/mem_cache/allocator/base.py",
    "sglang.srt.mem_cache.allocator.token": "sglang/srt/mem_cache/allocator/token.py",
    "sglang.srt.mem_cache.allocator.paged": "sglang/srt/mem_cache/allocator/paged.py",
}
VLLM_FILES = {
    "vllm.v1.core.kv_cache_metrics": "vllm/v1/core/kv_cache_metrics.py",
    "vllm.v1.core.kv_cache_utils": "vllm/v1/core/kv_cache_utils.py",
    "vllm.v1.core.block_pool": "vllm/v1/core/block_pool.py",
}


class _Anything(types.ModuleType):
    """A stand-in module: any attribute is a fresh placeholder class (enough for imports and annotations)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


class _StubFinder:
    """Serves every module under `prefixes` that is not a real file we load as a stand-in."""

    def __init__(self, prefixes: tuple[str, ...], real: set[str]) -> None:
        self.prefixes, self.real = prefixes, real

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name in self.real or not name.split(".")[0] in self.prefixes:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Anything(spec.name)
        module.__path__ = []  # a package, so deeper stand-ins resolve too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _function_from(path: Path, name: str, namespace: dict[str, Any]) -> Any:
    """One top-level function of a source file, executed on its own (its module imports half the runtime)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def load_sglang(root: Path, *, use_triton: bool) -> types.SimpleNamespace:
    """SGLang 0.5.23's TokenToKVPoolAllocator and PagedTokenToKVPoolAllocator (Triton kernels when use_triton)."""
    import torch

    sys.meta_path.insert(0, _StubFinder(("sglang",), set(SGLANG_FILES)))
    utils = types.ModuleType("sglang.srt.utils")
    utils.get_bool_env_var = lambda name, default="false": False  # SGLANG_DEBUG_MEMORY_POOL off, as in serving
    utils.is_hip = lambda: False
    utils.next_power_of_2 = lambda n: 1 << (n - 1).bit_length() if n > 0 else 1
    utils.get_num_new_pages = _function_from(root / "sglang/srt/utils/common.py", "get_num_new_pages",
                                             {"torch": torch, "Optional": Any})
    sys.modules["sglang.srt.utils"] = utils
    platforms = types.ModuleType("sglang.srt.platforms")
    platforms.current_platform = types.SimpleNamespace(capabilities=types.SimpleNamespace(supports_triton=use_triton))
    sys.modules["sglang.srt.platforms"] = platforms
    modules = {name: _load(name, root / rel) for name, rel in SGLANG_FILES.items()}
    return types.SimpleNamespace(
        TokenToKVPoolAllocator=modules["sglang.srt.mem_cache.allocator.token"].TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=modules["sglang.srt.mem_cache.allocator.paged"].PagedTokenToKVPoolAllocator,
        kernels=modules["sglang.kernels.ops.memory.allocator"],
    )


def load_vllm_block_pool(root: Path) -> Any:
    """vLLM 0.34.0's BlockPool (with its FreeKVCacheBlockQueue and KVCacheBlock)."""
    sys.meta_path.insert(0, _StubFinder(("vllm",), set(VLLM_FILES)))
    logger_module = types.ModuleType("vllm.logger")
    logger_module.init_logger = logging.getLogger
    sys.modules["vllm.logger"] = logger_module
    events = _Anything("vllm.distributed.kv_events")
    events.MEDIUM_GPU = "GPU"
    sys.modules["vllm.distributed.kv_events"] = events
    gc_utils = types.ModuleType("vllm.utils.gc_utils")
    gc_utils.gc_untrack = lambda objects: None
    sys.modules["vllm.utils.gc_utils"] = gc_utils
    modules = {name: _load(name, root / rel) for name, rel in VLLM_FILES.items()}
    return modules["vllm.v1.core.block_pool"].BlockPool
