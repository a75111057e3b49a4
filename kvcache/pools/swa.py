"""HybridSWAKVPool: full-attention layers in one pool, sliding-window layers in a smaller one.

Callers use full-pool token indices for every layer; writes to a sliding layer go to
the SWA row that the SWA allocator mapped that token to (`full_to_swa`). SGLang
0.5.23's names work too: full_kv_pool, swa_kv_pool, register_mapping,
translate_loc_from_full_to_swa, and layers given as objects with `.layer_id`.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache.pools.mha import MHATokenToKVPool


class HybridSWAKVPool:
    """A full pool and a SWA pool behind the one per-layer API."""

    def __init__(self, *, full: MHATokenToKVPool, swa: MHATokenToKVPool, full_to_swa: torch.Tensor) -> None:
        self.full = full
        self.swa = swa
        self.full_to_swa = full_to_swa
        self._swa_layers = frozenset(swa.layer_ids)
        self.size = full.size
        self.page_size = full.page_size
        self.dtype = full.dtype
        self.device = full.device

    @property
    def full_kv_pool(self) -> MHATokenToKVPool:
        return self.full

    @property
    def swa_kv_pool(self) -> MHATokenToKVPool:
        return self.swa

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Use this full -> SWA table (SGLang's allocator registers its own at construction)."""
        self.full_to_swa = full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa[kv_indices]

    @staticmethod
    def _layer_id(layer: Any) -> int:
        return layer if isinstance(layer, int) else layer.layer_id

    def _pool(self, layer: Any) -> MHATokenToKVPool:
        return self.swa if self._layer_id(layer) in self._swa_layers else self.full

    def translate(self, layer: Any, loc: torch.Tensor) -> torch.Tensor:
        """Full-pool token indices -> rows of the pool that holds `layer`."""
        return self.full_to_swa[loc] if self._layer_id(layer) in self._swa_layers else loc

    def get_key_buffer(self, layer_id: Any) -> torch.Tensor:
        return self._pool(layer_id).get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: Any) -> torch.Tensor:
        return self._pool(layer_id).get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self._pool(layer_id).get_kv_buffer(layer_id)

    def set_kv_buffer(
        self, layer: Any, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
        k_scale: float | None = None, v_scale: float | None = None, layer_id_override: int | None = None,
    ) -> None:
        target = layer if layer_id_override is None else layer_id_override
        self._pool(target).set_kv_buffer(target, self.translate(target, loc), cache_k, cache_v, k_scale, v_scale)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        full, swa = self.full.get_kv_size_bytes(), self.swa.get_kv_size_bytes()
        return full[0] + swa[0], full[1] + swa[1]

    @property
    def nbytes(self) -> int:
        """The two pools' buffers (the mapping belongs to the allocator)."""
        return self.full.nbytes + self.swa.nbytes
