"""MHATokenToKVPool: K and V buffers per layer for MHA/GQA (and sliding-window) layers.

All layers' buffers are views into one allocation (one block of rounding, one failure point).
Methods follow SGLang 0.5.23's KV pool API: a layer is a global layer number or an
object with `.layer_id` (SGLang passes its RadixAttention layer).

Each buffer has size + page_size rows: row (page) 0 absorbs padded writes, so token
indices 1..size are usable.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from kvcache.inputs.dtypes import KVCacheDtype
from kvcache.memory.device_buffers import carve, tensor_bytes
from kvcache.pools.codec import CacheTensor, LayerIndex, cache_segments


class MHATokenToKVPool:
    """Per-token K/V for `layer_ids` (global layer numbers), each [rows, kv_heads, head_dim]."""

    def __init__(
        self, *, size: int, page_size: int, dtype: KVCacheDtype, kv_heads: int, head_dim: int, v_head_dim: int,
        layer_ids: Sequence[int], device: torch.device,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self._local = LayerIndex(layer_ids)
        self.layer_ids = self._local.layer_ids
        self.layer_num = len(self.layer_ids)
        self.start_layer = self.layer_ids[0] if self.layer_ids else 0
        self.end_layer = self.layer_ids[-1] if self.layer_ids else -1
        self.head_num, self.head_dim, self.v_head_dim = kv_heads, head_dim, v_head_dim
        rows = size + page_size
        per_layer = cache_segments(rows, kv_heads, head_dim, dtype) + cache_segments(rows, kv_heads, v_head_dim, dtype)
        parts = carve(per_layer * len(self.layer_ids), device)  # one allocation for every layer's K and V
        self._k: list[CacheTensor] = []
        self._v: list[CacheTensor] = []
        for _ in self.layer_ids:
            self._k.append(CacheTensor.take(parts, dtype))
            self._v.append(CacheTensor.take(parts, dtype))

    def get_key_buffer(self, layer_id: Any) -> torch.Tensor:
        return self._k[self._local(layer_id)].read()

    def get_value_buffer(self, layer_id: Any) -> torch.Tensor:
        return self._v[self._local(layer_id)].read()

    def get_kv_buffer(self, layer_id: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_key_scales(self, layer_id: Any) -> torch.Tensor | None:
        """FP4 per-16 scale bytes of K (None for other formats)."""
        return self._k[self._local(layer_id)].scales

    def get_value_scales(self, layer_id: Any) -> torch.Tensor | None:
        return self._v[self._local(layer_id)].scales

    def set_kv_buffer(
        self, layer: Any, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
        k_scale: float | None = None, v_scale: float | None = None, layer_id_override: int | None = None,
    ) -> None:
        """Write K and V ([n, kv_heads, dim], model dtype) for token indices `loc` (SGLang 0.5.23's arguments:
        values are divided by k_scale / v_scale before a narrower store; layer_id_override picks the layer)."""
        i = self._local(layer if layer_id_override is None else layer_id_override)
        self._k[i].write(loc, cache_k if k_scale is None else cache_k / k_scale)
        self._v[i].write(loc, cache_v if v_scale is None else cache_v / v_scale)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Bytes of all K buffers and of all V buffers (SGLang 0.5.23)."""
        return (tensor_bytes(t for c in self._k for t in c.tensors()), tensor_bytes(t for c in self._v for t in c.tensors()))

    @property
    def nbytes(self) -> int:
        return tensor_bytes(t for c in (*self._k, *self._v) for t in c.tensors())

    def named_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Every tensor by the plan's name (`{prefix}.{layer}.k`, `.k_scales`, `.v`, ...), layer by layer."""
        out: dict[str, torch.Tensor] = {}
        for layer, k, v in zip(self.layer_ids, self._k, self._v):
            out.update(k.named(f"{prefix}.{layer}.k"))
            out.update(v.named(f"{prefix}.{layer}.v"))
        return out
