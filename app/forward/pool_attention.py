"""PoolAttention: a decode step's attention through the KV pools (write with set_kv_buffer, read through req_to_token)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from app.forward.batch import DecodeBatch
from app.forward.paged_attention import paged_decode_attention


class AttentionBackend(Protocol):
    """Where a decoder's attention keeps and reads K/V: the pools, or (in tests) dense history."""

    def gqa(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: DecodeBatch,
            scale: float) -> torch.Tensor: ...

    def mla(self, layer_id: int, q_nope: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
            w_uk: torch.Tensor, w_uv: torch.Tensor, batch: DecodeBatch, scale: float) -> torch.Tensor: ...


class PoolAttention:
    """Attention over an MHA or MLA token-to-KV pool; rows of req_to_token say where each request's tokens are."""

    def __init__(self, *, token_to_kv_pool: Any, req_to_token: torch.Tensor) -> None:
        self.pool = token_to_kv_pool
        self.req_to_token = req_to_token

    def gqa(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: DecodeBatch,
            scale: float) -> torch.Tensor:
        """Store this token's K/V at out_cache_loc, then attend over every position of each request."""
        self.pool.set_kv_buffer(layer_id, batch.out_cache_loc, k, v)
        k_buffer, v_buffer = self.pool.get_key_buffer(layer_id), self.pool.get_value_buffer(layer_id)
        return paged_decode_attention(q, k_buffer, v_buffer, self.req_to_token, batch.req_pool_indices,
                                      batch.seq_lens, scale)

    def mla(self, layer_id: int, q_nope: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
            w_uk: torch.Tensor, w_uv: torch.Tensor, batch: DecodeBatch, scale: float) -> torch.Tensor:
        """MLA in absorbed form: queries move into the latent space (W_UK), attend over the cached
        latents as one shared head, and the result leaves through W_UV. Returns [bs, heads, v_dim]."""
        self.pool.set_mla_kv_buffer(layer_id, batch.out_cache_loc, c_kv[:, None, :], k_pe)
        latent = self.pool.get_key_buffer(layer_id)  # [rows, 1, rank + rope]
        rank = c_kv.shape[-1]
        q_latent = torch.einsum("bhn,hnr->bhr", q_nope, w_uk)
        q = torch.cat((q_latent, q_pe), dim=-1)
        out = paged_decode_attention(q, latent, latent[..., :rank], self.req_to_token, batch.req_pool_indices,
                                     batch.seq_lens, scale)
        return torch.einsum("bhr,hvr->bhv", out, w_uv)
