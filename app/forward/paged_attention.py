"""Decode attention over a paged KV pool: K/V rows found through req_to_token, one query token per request.

`paged_decode_attention` runs the Triton kernel on CUDA (app.forward.triton_decode) and
plain torch elsewhere; on `meta` it only shapes the output. Grouped-query attention
(KV heads shared by groups of query heads) and MLA's absorbed form (one latent "head"
whose first v_dim elements are the values) are the same call.
"""

from __future__ import annotations

import torch


def gather_rows(buffer: torch.Tensor, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """buffer[index] in `dtype`; one-byte float formats are gathered as bytes (CPU indexing lacks FP8)."""
    if buffer.dtype.itemsize == 1 and buffer.dtype.is_floating_point:
        return buffer.view(torch.uint8)[index].view(buffer.dtype).to(dtype)
    return buffer[index].to(dtype)


def paged_decode_attention_torch(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """q [bs, heads, dk]; buffers [rows, kv_heads, dk|dv] -> [bs, heads, dv] in q's dtype (one host sync)."""
    bs, heads, _ = q.shape
    kv_heads, dv = k_buffer.shape[1], v_buffer.shape[2]
    if q.device.type == "meta":
        return torch.empty(bs, heads, dv, dtype=q.dtype, device=q.device)
    max_len = max(int(seq_lens.max()), 1) if bs else 1
    positions = torch.arange(max_len, device=q.device)
    tokens = req_to_token[req_pool_indices.long()][:, :max_len].long()  # [bs, L]
    valid = positions[None, :] < seq_lens.long()[:, None]
    tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    k = gather_rows(k_buffer, tokens)  # [bs, L, kv_heads, dk]
    v = gather_rows(v_buffer, tokens)
    group = heads // kv_heads
    qg = q.float().view(bs, kv_heads, group, -1)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgl,blkd->bkgd", scores.softmax(-1), v)
    return out.reshape(bs, heads, dv).to(q.dtype)


def paged_decode_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """The kernel for q's device: Triton on CUDA (no host sync, so CUDA graphs capture it), torch elsewhere."""
    if q.is_cuda:
        from app.forward.triton_decode import paged_decode_attention_triton

        return paged_decode_attention_triton(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scale)
    return paged_decode_attention_torch(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scale)
