"""MHATokenToKVPool: K and V buffers per layer for MHA/GQA (and sliding-window) layers.

What it holds is its part of the plan (kvcache.sizing.pool_config.KVPoolPlan: its rows, layers and each
token's tensors, `slot()`), stated there once; the layer spec it was planned from says how values are stored
(the KV dtype) and its head counts. The tensors are views of the worker's arena handed to it by the builder
(kvcache.pools.planned_views), checked against the plan's slot; built alone it carves them from an arena of its
own. Methods follow SGLang 0.5.23's KV pool API: a layer is a global layer number or an object with `.layer_id`
(SGLang passes its RadixAttention layer).

Each buffer has size + page_size rows: row (page) 0 absorbs padded writes, so token
indices 1..size are usable.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.pools.codec import CacheTensor, LayerIndex
from kvcache.pools.planned_views import PlannedRows, Views, kv_pool_slot, take_views
from kvcache.sizing.layer_specs import AttentionSpec
from kvcache.sizing.pool_config import KVPoolPlan


class MHATokenToKVPool(PlannedRows):
    """Per-token K/V of the plan's layers, each [rows, kv_heads, head_dim]: the views named `{buffer}.{layer}.k`,
    `.v` (and FP4's `_scales`) in `views`, or, without views, an arena of its own. `spec` is the layer spec the
    plan's row came from (kvcache.sizing.layer_specs.AttentionSpec). size, nbytes, named_tensors and
    get_kv_size_bytes describe the rows it holds now (PlannedRows: as built or as a live resize left them)."""

    def __init__(self, *, plan: KVPoolPlan, spec: AttentionSpec, device: torch.device, views: Views | None = None) -> None:
        self.size = plan.num_tokens
        self.page_size = plan.page_size
        self.dtype = spec.dtype
        self.device = device
        self._local = LayerIndex(plan.layer_ids)
        self.layer_ids = self._local.layer_ids
        self.layer_num = len(self.layer_ids)
        self.start_layer = self.layer_ids[0] if self.layer_ids else 0
        self.end_layer = self.layer_ids[-1] if self.layer_ids else -1
        self.head_num, self.head_dim, self.v_head_dim = spec.kv_heads, spec.head_dim, spec.v_head_dim
        self._slot = kv_pool_slot(plan, spec)
        self._views = take_views([self._slot], views, device)
        parts = list(self._views)
        self._k: list[CacheTensor] = []
        self._v: list[CacheTensor] = []
        for _ in self.layer_ids:
            self._k.append(CacheTensor.take(parts, self.dtype))
            self._v.append(CacheTensor.take(parts, self.dtype))

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
        """Bytes of all K buffers and of all V buffers over the rows it holds now, FP4 scales included (SGLang
        0.5.23's numbers; each buffer's bytes are its built rows' share, so the rows it holds scale them exactly)."""
        k, v = (self.bytes_held(sum(c.nbytes for c in side)) for side in (self._k, self._v))
        return k, v
