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
    radix = load_sglang_radix(root)              # .RadixCache, .release_kv_cache, .alloc_for_extend, ...
    vllm = load_vllm(root)                       # .BlockPool, .KVCacheManager, .CPUBlockTables, ...
"""

from __future__ import annotations

import __future__
import ast
import contextlib
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
    flags = __future__.annotations.compiler_flag  # annotations stay strings, as in the source file
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", flags=flags), namespace)
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


SGLANG_RADIX_FILES = {
    "sglang.kernels.ops.memory.common": "sglang/kernels/ops/memory/common.py",
    "sglang.srt.mem_cache.unified_cache.component_type": "sglang/srt/mem_cache/unified_cache/component_type.py",
    "sglang.srt.mem_cache.evict_policy": "sglang/srt/mem_cache/evict_policy.py",
    "sglang.srt.mem_cache.utils": "sglang/srt/mem_cache/utils.py",
    "sglang.srt.mem_cache.cache_init_params": "sglang/srt/mem_cache/cache_init_params.py",
    "sglang.srt.mem_cache.base_prefix_cache": "sglang/srt/mem_cache/base_prefix_cache.py",
    "sglang.srt.mem_cache.radix_cache": "sglang/srt/mem_cache/radix_cache.py",
    "sglang.srt.mem_cache.pure_swa_radix_cache": "sglang/srt/mem_cache/pure_swa_radix_cache.py",
    "sglang.srt.mem_cache.common": "sglang/srt/mem_cache/common.py",
    "sglang.srt.mem_cache.allocation": "sglang/srt/mem_cache/allocation.py",
    "sglang.srt.mem_cache.allocator.swa": "sglang/srt/mem_cache/allocator/swa.py",
}


class _EventRecorder:
    """Stand-in for SGLang's KV event recorder: events off, as in a default server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class SWAIndexPool:
    """Stand-in for SGLang's SWA KV pool, as far as its SWA allocator asks: no sub-pools, no per-request ring,
    and the full-to-SWA index map the allocator registers (read back by translate_loc_from_full_to_swa)."""

    full_kv_pool = swa_kv_pool = swa_req_ring_size = None

    def register_mapping(self, mapping: Any) -> None:
        self.full_to_swa_index_mapping = mapping

    def translate_loc_from_full_to_swa(self, kv_indices: Any) -> Any:
        return self.full_to_swa_index_mapping[kv_indices]


def _expect(invariant: Any, value: Any, *, msg: str = "") -> Any:
    """Stand-in for SGLang's invariant checks (a tensor of conditions): every one is fatal here."""
    import torch

    assert value is None or bool(torch.as_tensor(value).all()), f"{invariant}: {msg}"
    return value


def load_sglang_radix(root: Path, *, use_triton: bool = False) -> types.SimpleNamespace:
    """SGLang 0.5.23's RadixCache, PureSWARadixCache, the scheduler helpers of mem_cache/common.py and
    allocation.py, ReqKvInfo, ReqToTokenPool and SWATokenToKVPoolAllocator (its KV pool a stand-in, SWAIndexPool),
    with the Triton row writes when use_triton (else the host paths). Call after load_sglang."""
    import torch

    sys.meta_path.insert(0, _StubFinder(("sglang",), set(SGLANG_RADIX_FILES)))
    events = _Anything("sglang.srt.mem_cache.events")
    events.KVCacheEventRecorder, events.KvEventLoraNames, events.LoRANameTable = _EventRecorder, dict, dict
    sys.modules[events.__name__] = events
    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = types.SimpleNamespace(SGLANG_RADIX_FORCE_MISS=types.SimpleNamespace(get=lambda: False))
    sys.modules[environ.__name__] = environ
    context = _Anything("sglang.srt.runtime_context")
    context.get_serving = lambda: types.SimpleNamespace(strip_thinking_cache=False)
    context.get_spec = lambda: types.SimpleNamespace(speculative_algorithm=None)
    context.get_parallel = lambda: types.SimpleNamespace(dcp_enabled=False)
    backend = "triton" if use_triton else "torch_native"  # decides whether rows are written by a Triton kernel
    context.attention_backends = lambda: (backend, backend)
    sys.modules[context.__name__] = context
    interleave = types.ModuleType("sglang.srt.mem_cache.allocator.page_interleave")
    interleave.page_interleave_shard_size = lambda allocator: 1  # stock allocators (no page-interleave sharding)
    sys.modules[interleave.__name__] = interleave
    swa_pool = types.ModuleType("sglang.srt.mem_cache.base_swa_memory_pool")
    swa_pool.BaseSWAKVPool = SWAIndexPool
    sys.modules[swa_pool.__name__] = swa_pool
    invariants = _Anything("sglang.srt.utils.invariants")
    invariants.Invariant, invariants.expect = lambda name, *args, **kwargs: name, _expect
    sys.modules[invariants.__name__] = invariants
    sys.modules["sglang.srt.platforms"].current_platform.get_paged_allocator_cls = lambda: None
    utils = sys.modules["sglang.srt.utils"]
    utils.__path__ = []
    for name in ("is_cpu", "is_cuda", "is_npu", "is_xpu"):
        setattr(utils, name, lambda *args: False)
    utils.support_triton = lambda backend: backend == "triton"
    common = types.ModuleType("sglang.srt.utils.common")
    common.is_pin_memory_available = lambda device=None: False
    common.get_num_new_pages, common.torch = utils.get_num_new_pages, torch
    for name in ("ceil_div", "ceil_align", "async_h2d"):
        _definition_from(root / "sglang/srt/utils/common.py", name, common.__dict__)
    sys.modules[common.__name__] = common
    modules = {name: _load(name, root / rel) for name, rel in SGLANG_RADIX_FILES.items()}
    batch_py, pool_py = root / "sglang/srt/managers/schedule_batch.py", root / "sglang/srt/mem_cache/memory_pool.py"
    importlib.import_module("sglang.srt.managers.schedule_batch")  # a stand-in: dataclass reads its module
    kv_info = _definition_from(batch_py, "ReqKvInfo", {
        "dataclasses": __import__("dataclasses"), "__name__": "sglang.srt.managers.schedule_batch",
        "ceil_align": common.ceil_align, "ComponentType": modules[
            "sglang.srt.mem_cache.unified_cache.component_type"].ComponentType})
    saver = types.SimpleNamespace(create=lambda enable: types.SimpleNamespace(region=lambda kind: contextlib.nullcontext()))
    req_to_token_pool = _definition_from(pool_py, "ReqToTokenPool", {
        "torch": torch, "TorchMemorySaverAdapter": saver, "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
        "__name__": "sglang.srt.mem_cache.memory_pool"})
    names = {"sglang.srt.mem_cache.base_prefix_cache": ("MatchPrefixParams", "EvictParams"),
             "sglang.srt.mem_cache.cache_init_params": ("CacheInitParams",),
             "sglang.srt.mem_cache.radix_cache": ("RadixCache", "RadixKey"),
             "sglang.srt.mem_cache.pure_swa_radix_cache": ("PureSWARadixCache",),
             "sglang.srt.mem_cache.common": ("match_kv_cache", "checkpoint_kv_cache", "release_kv_cache",
                                             "evict_from_tree_cache", "free_swa_out_of_window_slots"),
             "sglang.srt.mem_cache.allocation": ("alloc_for_extend", "alloc_for_decode")}
    found = {name: getattr(modules[module], name) for module, listed in names.items() for name in listed}
    return types.SimpleNamespace(**found, ReqKvInfo=kv_info, ReqToTokenPool=req_to_token_pool, SWAIndexPool=SWAIndexPool,
                                 SWATokenToKVPoolAllocator=modules["sglang.srt.mem_cache.allocator.swa"].SWATokenToKVPoolAllocator)


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
