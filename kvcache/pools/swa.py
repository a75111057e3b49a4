"""HybridSWAKVPool: full-attention layers in one pool, sliding-window layers in a smaller one.

Callers use full-pool token indices for every layer; writes to a sliding layer go to
the SWA row that the SWA allocator mapped that token to (`full_to_swa`).
"""

from __future__ import annotations

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

    def _pool(self, layer_id: int) -> MHATokenToKVPool:
        return self.swa if layer_id in self._swa_layers else self.full

    def translate(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """Full-pool token indices -> rows of the pool that holds `layer_id`."""
        return self.full_to_swa[loc] if layer_id in self._swa_layers else loc

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._pool(layer_id).get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._pool(layer_id).get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._pool(layer_id).get_kv_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        self._pool(layer_id).set_kv_buffer(layer_id, self.translate(layer_id, loc), cache_k, cache_v)

    @property
    def nbytes(self) -> int:
        """The two pools' buffers (the mapping belongs to the allocator)."""
        return self.full.nbytes + self.swa.nbytes
