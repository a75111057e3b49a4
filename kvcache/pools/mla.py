"""MLATokenToKVPool: one latent buffer per MLA layer, [rows, 1, kv_lora_rank + qk_rope_head_dim].

The first kv_lora_rank elements are the compressed KV (the 'value' view); the rest
is the decoupled RoPE key. DeepSeek-V3.2 (sparse attention) adds per layer the indexer's
key buffer, [rows, index_row_bytes] of uint8: fp8 keys and their float32 scales; with an fp8
KV cache its latent is one packed byte row per token (`packed_latent`, kvcache.sizing.dsa_latent).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from kvcache.sizing.dsa_latent import DSAFp8Latent, PackedLatentTensor
from kvcache.inputs.dtypes import KVCacheDtype
from kvcache.memory.device_buffers import carve, tensor_bytes
from kvcache.pools.codec import CacheTensor, LayerIndex, cache_segments


class MLATokenToKVPool:
    """Per-token MLA latents for `layer_ids`; row (page) 0 is padding."""

    def __init__(
        self, *, size: int, page_size: int, dtype: KVCacheDtype, kv_lora_rank: int, qk_rope_head_dim: int,
        layer_ids: Sequence[int], device: torch.device, index_row_bytes: int = 0,
        packed_latent: DSAFp8Latent | None = None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.packed_latent = packed_latent
        self.index_row_bytes = index_row_bytes  # 0 unless DSA: the indexer's per-token key row
        self._local = LayerIndex(layer_ids)
        self.layer_ids = self._local.layer_ids
        self.layer_num = len(self.layer_ids)
        self.start_layer = self.layer_ids[0] if self.layer_ids else 0
        self.end_layer = self.layer_ids[-1] if self.layer_ids else -1
        rows = size + page_size
        if packed_latent is None:
            segments = cache_segments(rows, 1, kv_lora_rank + qk_rope_head_dim, dtype)
        else:
            segments = [((rows, 1, packed_latent.row_bytes), torch.uint8)]
        if index_row_bytes:
            segments.append(((rows, index_row_bytes), torch.uint8))
        parts = carve(segments * len(self.layer_ids), device)  # one allocation for every layer
        self._kv: list[CacheTensor | PackedLatentTensor] = []
        self._index: list[torch.Tensor] = []
        for _ in self.layer_ids:
            if packed_latent is None:
                self._kv.append(CacheTensor.take(parts, dtype))
            else:
                self._kv.append(PackedLatentTensor(parts.pop(0), packed_latent))
            if index_row_bytes:
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
        return self.nbytes

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """The sparse-attention indexer's key rows of one layer (SGLang's name); DSA models only."""
        if not self._index:
            raise ValueError("this MLA pool has no indexer buffer (the model is not a DeepSeek-V3.2 sparse-attention model)")
        return self._index[self._local(layer_id)]

    @property
    def nbytes(self) -> int:
        return tensor_bytes([*(t for c in self._kv for t in c.tensors()), *self._index])

    def named_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Every tensor by the plan's name (`{prefix}.{layer}.latent`, `.index_k`), layer by layer."""
        out: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layer_ids):
            out.update(self._kv[i].named(f"{prefix}.{layer}.latent"))
            if self._index:
                out[f"{prefix}.{layer}.index_k"] = self._index[i]
        return out
