"""MLATokenToKVPool: one latent buffer per MLA layer, [rows, 1, kv_lora_rank + qk_rope_head_dim].

The first kv_lora_rank elements are the compressed KV (the 'value' view); the rest
is the decoupled RoPE key. DeepSeek-V3.2 (sparse attention) adds per layer the indexer's
key buffer, [rows, index_row_bytes] of uint8: fp8 keys and their float32 scales; with an fp8
KV cache its latent is one packed byte row per token (`packed_latent`, kvcache.sizing.dsa_latent).
What it holds is its part of the plan (kvcache.sizing.pool_config.KVPoolPlan.slot(), the rows of
kvcache.sizing.layer_specs.MLASpec.row_tensors per layer), stated there once; the spec says how the latent is
stored and how wide its parts are. The views are handed to it by the builder (kvcache.pools.planned_views) and
checked against the plan's slot; built alone it carves them from an arena of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.pools.dsa_latent_rows import PackedLatentTensor
from kvcache.pools.codec import CacheTensor, LayerIndex
from kvcache.pools.planned_views import PlannedRows, Views, kv_pool_slot, take_views
from kvcache.sizing.layer_specs import MLASpec
from kvcache.sizing.pool_config import KVPoolPlan


class MLATokenToKVPool(PlannedRows):
    """Per-token MLA latents of the plan's layers; row (page) 0 is padding. A spec with `index_head_dim` > 0
    (DeepSeek-V3.2) adds the sparse-attention indexer's keys. The views named `{buffer}.{layer}.latent`
    (`_scales`, `.index_k`) in `views`, or, without views, an arena of its own. size, nbytes, named_tensors and
    get_kv_size_bytes describe the rows it holds now (PlannedRows: as built or as a live resize left them)."""

    def __init__(self, *, plan: KVPoolPlan, spec: MLASpec, device: torch.device, views: Views | None = None) -> None:
        self.size = plan.num_tokens
        self.page_size = plan.page_size
        self.dtype = dtype = spec.dtype
        self.device = device
        self.kv_lora_rank = spec.kv_lora_rank
        self.qk_rope_head_dim = spec.qk_rope_head_dim
        self.packed_latent = packed_latent = spec.packed_latent
        self.index_row_bytes = spec.index_bytes_per_token  # 0 unless DSA: the indexer's per-token key row
        self._local = LayerIndex(plan.layer_ids)
        self.layer_ids = self._local.layer_ids
        self.layer_num = len(self.layer_ids)
        self.start_layer = self.layer_ids[0] if self.layer_ids else 0
        self.end_layer = self.layer_ids[-1] if self.layer_ids else -1
        self._slot = kv_pool_slot(plan, spec)
        self._views = take_views([self._slot], views, device)
        parts = list(self._views)
        self._kv: list[CacheTensor | PackedLatentTensor] = []
        self._index: list[torch.Tensor] = []
        for _ in self.layer_ids:
            if packed_latent is None:
                self._kv.append(CacheTensor.take(parts, dtype))
            else:
                self._kv.append(PackedLatentTensor(parts.pop(0), packed_latent))
            if self.index_row_bytes:
                self._index.append(parts.pop(0))

    def _buffer(self, layer_id: Any) -> CacheTensor | PackedLatentTensor:
        return self._kv[self._local(layer_id)]

    def get_key_buffer(self, layer_id: Any) -> torch.Tensor:
        """The whole latent (compressed KV and RoPE key)."""
        return self._buffer(layer_id).read()

    def get_value_buffer(self, layer_id: Any) -> torch.Tensor:
        """The compressed KV part, which attention reads as values."""
        if self.dtype.scale_group or self.packed_latent is not None:
            raise ValueError("this MLA latent is packed (FP4, or DSA's fp8 rows); read get_key_buffer (and its scales)")
        return self._buffer(layer_id).read()[..., : self.kv_lora_rank]

    def get_key_scales(self, layer_id: Any) -> torch.Tensor | None:
        return self._buffer(layer_id).scales

    def get_kv_buffer(self, layer_id: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(whole latent, its compressed-KV part), as SGLang 0.5.23's MLA pool returns them."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self, layer: Any, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Write whole latents ([n, 1, kv_lora_rank + qk_rope_head_dim]); cache_v is unused, as in SGLang."""
        self._buffer(layer if layer_id_override is None else layer_id_override).write(loc, cache_k)

    def set_mla_kv_buffer(
        self, layer: Any, loc: torch.Tensor, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor,
        layer_id_override: int | None = None,
    ) -> None:
        """Write the compressed KV and the RoPE key given apart ([n, 1, rank] and [n, 1, rope])."""
        self.set_kv_buffer(layer, loc, torch.cat((cache_k_nope, cache_k_rope), dim=-1), layer_id_override=layer_id_override)

    def get_kv_size_bytes(self) -> int:
        """Bytes of the latents (and a DSA indexer's keys) over the rows it holds now, as SGLang 0.5.23 counts them:
        its DSA pool adds the indexer's keys, its FP4 pool does not add the latents' scales; no slot padding."""
        return self.bytes_held(sum(t.nbytes for t in [*(kv.data for kv in self._kv), *self._index]))

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """The sparse-attention indexer's key rows of one layer (SGLang's name); DSA models only."""
        if not self._index:
            raise ValueError("this MLA pool has no indexer buffer (the model is not a DeepSeek-V3.2 sparse-attention model)")
        return self._index[self._local(layer_id)]
