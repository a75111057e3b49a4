"""PoolAttention: a decode or prefill step's attention through the KV pools (write with set_kv_buffer, read
through req_to_token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Union

import torch

from app.forward.batch import DecodeBatch, ExtendBatch
from app.forward.extend_attention import causal_extend_attention
from app.forward.paged_attention import gather_rows, paged_decode_attention

ForwardBatch = Union[DecodeBatch, ExtendBatch]


class AttentionBackend(Protocol):
    """Where a decoder's attention keeps and reads K/V: the pools, or (in tests) dense history."""

    def gqa(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
            scale: float) -> torch.Tensor: ...

    def mla(self, layer_id: int, q_nope: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
            w_uk: torch.Tensor, w_uv: torch.Tensor, batch: ForwardBatch, scale: float) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class SingleTokenRequests:
    """The requests of an extend step that feed one token each (decode requests riding in a mixed chunk): where
    their tokens are in the flat batch, their request-table rows and their lengths, the new token included."""

    tokens: torch.Tensor  # int64 [n]
    rows: torch.Tensor  # int64 [n]
    seq_lens: torch.Tensor  # int32 [n]

    @classmethod
    def of(cls, batch: ExtendBatch) -> "SingleTokenRequests | None":
        """None unless at least two requests feed one token (one is no batch)."""
        singles = [(start, row, prefix + 1) for row, prefix, start, n in batch.requests() if n == 1]
        if len(singles) < 2:
            return None
        device = batch.input_ids.device
        tokens, rows, lens = zip(*singles)
        return cls(tokens=torch.tensor(tokens, dtype=torch.int64, device=device),
                   rows=torch.tensor(rows, dtype=torch.int64, device=device),
                   seq_lens=torch.tensor(lens, dtype=torch.int32, device=device))


class PoolAttention:
    """Attention over an MHA or MLA token-to-KV pool; rows of req_to_token say where each request's tokens are."""

    def __init__(self, *, token_to_kv_pool: Any, req_to_token: torch.Tensor) -> None:
        self.pool = token_to_kv_pool
        self.req_to_token = req_to_token

    def gqa(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
            scale: float) -> torch.Tensor:
        """Store the new tokens' K/V at out_cache_loc, then attend over every position each request holds
        (causally over its new tokens in an extend step)."""
        self.pool.set_kv_buffer(layer_id, batch.out_cache_loc, k, v)
        k_buffer, v_buffer = self.pool.get_key_buffer(layer_id), self.pool.get_value_buffer(layer_id)
        if isinstance(batch, DecodeBatch):
            return paged_decode_attention(q, k_buffer, v_buffer, self.req_to_token, batch.req_pool_indices,
                                          batch.seq_lens, scale)
        out = q.new_empty(q.shape[0], q.shape[1], v_buffer.shape[-1])
        singles = SingleTokenRequests.of(batch)
        if singles is not None:  # one token over its context attends as a decode token does: one batched call
            out[singles.tokens] = paged_decode_attention(q[singles.tokens], k_buffer, v_buffer, self.req_to_token,
                                                         singles.rows, singles.seq_lens, scale)
        for row, prefix, start, n in batch.requests():
            if n == 1 and singles is not None:
                continue
            tokens = self.req_to_token[row, :prefix + n].to(torch.int64)
            keys, values = gather_rows(k_buffer, tokens, q.dtype), gather_rows(v_buffer, tokens, q.dtype)
            out[start:start + n] = causal_extend_attention(q[start:start + n], keys, values, prefix, scale)
        return out

    def mla(self, layer_id: int, q_nope: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
            w_uk: torch.Tensor, w_uv: torch.Tensor, batch: ForwardBatch, scale: float) -> torch.Tensor:
        """MLA. Decode in absorbed form: queries move into the latent space (W_UK), attend over the cached
        latents as one shared head, and the result leaves through W_UV. Extend as SGLang prefills: each
        request's cached latents expand to per-head keys (W_UK, plus the shared RoPE part) and values (W_UV).
        Returns [tokens, heads, v_dim]."""
        self.pool.set_mla_kv_buffer(layer_id, batch.out_cache_loc, c_kv[:, None, :], k_pe)
        latent = self.pool.get_key_buffer(layer_id)  # [rows, 1, rank + rope]
        rank = c_kv.shape[-1]

        def absorbed(q_nope: torch.Tensor, q_pe: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
            q = torch.cat((torch.einsum("bhn,hnr->bhr", q_nope, w_uk), q_pe), dim=-1)
            out = paged_decode_attention(q, latent, latent[..., :rank], self.req_to_token, rows, seq_lens, scale)
            return torch.einsum("bhr,hvr->bhv", out, w_uv)

        if isinstance(batch, DecodeBatch):
            return absorbed(q_nope, q_pe, batch.req_pool_indices, batch.seq_lens)
        q = torch.cat((q_nope, q_pe), dim=-1)
        heads = q.shape[1]
        out = q.new_empty(q.shape[0], heads, w_uv.shape[1])
        singles = SingleTokenRequests.of(batch)
        if singles is not None:  # decode requests riding in a mixed chunk: the absorbed decode path, batched
            out[singles.tokens] = absorbed(q_nope[singles.tokens], q_pe[singles.tokens], singles.rows,
                                           singles.seq_lens)
        for row, prefix, start, n in batch.requests():
            if n == 1 and singles is not None:
                continue
            tokens = self.req_to_token[row, :prefix + n].to(torch.int64)
            cached = gather_rows(latent, tokens, q.dtype)[:, 0]  # [prefix + n, rank + rope]
            c, pe = cached[:, :rank], cached[:, rank:]
            keys = torch.cat((torch.einsum("lr,hnr->lhn", c, w_uk), pe[:, None].expand(-1, heads, -1)), -1)
            values = torch.einsum("lr,hvr->lhv", c, w_uv)
            out[start:start + n] = causal_extend_attention(q[start:start + n], keys, values, prefix, scale)
        return out
