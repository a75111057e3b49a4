"""Load SGLang 0.5.23's real allocators and vLLM 0.34.0's real KV cache manager from their source files, nothing more.

Importing `sglang.srt.mem_cache.allocator` or `vllm.v1.core.block_pool` the normal way
pulls in each project's whole runtime (psutil, zmq, transformers, ...). The benchmark
only needs a few modules, so this loader executes exactly those files from an
installed (or copied) source tree under their real module names, and puts small
stand-ins in sys.modules for the helpers they import: package __init__s, loggers,
platform flags, event classes. The measured code -- SGLang's allocator classes and
Triton kernels; vLLM's BlockPool and free-block queue, its KVCacheManager with coordinator
and FullAttentionManager, and its CPU model runner's block table -- is the projects' own.
One piece is not: vLLM's CPU slot mapping is a compiled op (`torch.ops._C`, built only in
vLLM's CPU wheel, absent from the CUDA wheel and with no Python source), so
`slot_mapping_op` below stands in for it with numpy.

    root = Path(".../site-packages")          # holds sglang/ and vllm/
    sglang = load_sglang(root, use_triton=True)  # .TokenToKVPoolAllocator, .PagedTokenToKVPoolAllocator
    vllm = load_vllm(root)                       # .BlockPool, .KVCacheManager, .CPUBlockTables, ...
"""

from __future__ import annotations

import ast
import enum
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
    "vllm.utils.math_utils": "vllm/utils/math_utils.py",
    "vllm.v1.kv_cache_spec_registry": "vllm/v1/kv_cache_spec_registry.py",
    "vllm.v1.kv_cache_layout": "vllm/v1/kv_cache_layout.py",
    "vllm.v1.kv_cache_interface": "vllm/v1/kv_cache_interface.py",
    "vllm.v1.core.kv_cache_metrics": "vllm/v1/core/kv_cache_metrics.py",
    "vllm.v1.core.kv_cache_utils": "vllm/v1/core/kv_cache_utils.py",
    "vllm.v1.core.block_pool": "vllm/v1/core/block_pool.py",
    "vllm.v1.core.single_type_kv_cache_manager": "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm.v1.core.kv_cache_coordinator": "vllm/v1/core/kv_cache_coordinator.py",
    "vllm.v1.core.kv_cache_manager": "vllm/v1/core/kv_cache_manager.py",
    "vllm.v1.worker.cpu.block_table": "vllm/v1/worker/cpu/block_table.py",
}


class _Placeholder(type):
    """A placeholder class whose missing class attributes are placeholders too (enum members, nested names)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


def _placeholder(name: str) -> Any:
    return _Placeholder(name, (), {"__init__": lambda self, *a, **k: None})


class _Anything(types.ModuleType):
    """A stand-in module: any attribute is a fresh placeholder class (enough for imports and annotations)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(name)
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


def _definition_from(path: Path, name: str, namespace: dict[str, Any]) -> Any:
    """One top-level function, class or constant of a source file, executed on its own (its module imports half the runtime)."""
    def names(node: ast.stmt) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return [node.name]
        return [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if name in names(n))
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
    utils.get_num_new_pages = _definition_from(root / "sglang/srt/utils/common.py", "get_num_new_pages",
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


def slot_mapping_op(block_table: Any, slot_mapping: Any, idx_mapping: Any, query_start_loc: Any, positions: Any,
                    block_size: int, mapping_enabled: bool, pad_slot_id: int) -> None:
    """Stand-in (numpy) for vLLM's compiled compute_slot_mapping_cpu: every token's slot from its request's block-table row.

    The arithmetic is the one vLLM's GPU Triton kernel does: slot = table[row, pos // block] * block + pos % block,
    padding after the batch's last token. Mapping always enabled here (full attention).
    """
    import numpy as np

    starts, out = query_start_loc.numpy(), slot_mapping.numpy()
    count = int(starts[-1])
    rows = np.repeat(idx_mapping.numpy(), np.diff(starts))
    pos = positions.numpy()[:count]
    out[:count] = block_table.numpy()[rows, pos // block_size] * block_size + pos % block_size
    out[count:] = pad_slot_id


def load_vllm(root: Path) -> types.SimpleNamespace:
    """vLLM 0.34.0's BlockPool, KVCacheManager (and what configures it), CPUBlockTables and RequestStatus."""
    sys.meta_path.insert(0, _StubFinder(("vllm",), set(VLLM_FILES)))
    logger_module = types.ModuleType("vllm.logger")
    logger_module.init_logger = logging.getLogger
    sys.modules["vllm.logger"] = logger_module
    events = _Anything("vllm.distributed.kv_events")
    events.MEDIUM_GPU, events.MEDIUM_CPU = "GPU", "CPU"
    sys.modules["vllm.distributed.kv_events"] = events
    gc_utils = types.ModuleType("vllm.utils.gc_utils")
    gc_utils.gc_untrack = lambda objects: objects
    gc_utils.untracked_list = list
    sys.modules["vllm.utils.gc_utils"] = gc_utils
    request = _Anything("vllm.v1.request")  # the Request class stays a stand-in: callers bring request-shaped objects
    request.RequestStatus = _definition_from(root / "vllm/v1/request.py", "RequestStatus",
                                           {"enum": enum, "FinishReason": _placeholder("FinishReason"),
                                            "__name__": "vllm.v1.request"})
    sys.modules["vllm.v1.request"] = request
    attention_utils = _Anything("vllm.v1.attention.backends.utils")
    attention_utils.PAD_SLOT_ID = _definition_from(root / "vllm/v1/attention/backends/utils.py", "PAD_SLOT_ID", {})
    sys.modules["vllm.v1.attention.backends.utils"] = attention_utils
    cpu_ops = _Anything("vllm._cpu_ops")
    cpu_ops.compute_slot_mapping_cpu = slot_mapping_op
    sys.modules["vllm._cpu_ops"] = cpu_ops
    importlib.import_module("vllm")._cpu_ops = cpu_ops  # the block table does `from vllm import _cpu_ops`
    modules = {name: _load(name, root / rel) for name, rel in VLLM_FILES.items()}
    interface = modules["vllm.v1.kv_cache_interface"]
    return types.SimpleNamespace(
        BlockPool=modules["vllm.v1.core.block_pool"].BlockPool,
        KVCacheManager=modules["vllm.v1.core.kv_cache_manager"].KVCacheManager,
        KVCacheConfig=interface.KVCacheConfig,
        KVCacheGroupSpec=interface.KVCacheGroupSpec,
        FullAttentionSpec=interface.FullAttentionSpec,
        CPUBlockTables=modules["vllm.v1.worker.cpu.block_table"].CPUBlockTables,
        RequestStatus=request.RequestStatus,
    )
