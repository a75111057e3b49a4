"""Causal attention of one request's new (extend) tokens over its prefix and themselves, K/V given densely.

The pool backend gathers a request's K/V rows through req_to_token and calls this once
per request. On CUDA it is torch's fused scaled-dot-product attention (flash, memory-
efficient or cuDNN kernels only: the math fallback would hold the whole score matrix,
which no engine does, so a shape they refuse raises instead of silently costing more);
elsewhere a float32 reference in plain torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_extend_attention_torch(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix_len: int,
                                  scale: float) -> torch.Tensor:
    """q [n, heads, dk]; keys [prefix + n, kv_heads, dk], values [.., kv_heads, dv] -> [n, heads, dv] in q's dtype."""
    n, heads, _ = q.shape
    kv_heads, dv = keys.shape[1], values.shape[2]
    group = heads // kv_heads
    qg = q.float().view(n, kv_heads, group, -1)
    scores = torch.einsum("nkgd,lkd->kgnl", qg, keys.float()) * scale
    allowed = torch.arange(keys.shape[0], device=q.device)[None, :] <= (prefix_len + torch.arange(n, device=q.device))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("kgnl,lkd->nkgd", scores.softmax(-1), values.float())
    return out.reshape(n, heads, dv).to(q.dtype)


def causal_extend_attention_cuda(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix_len: int,
                                 scale: float) -> torch.Tensor:
    """The same on CUDA through SDPA's fused kernels; KV heads are repeated per query group and a value head
    narrower than the key head is zero-padded (the kernels want one head size), then cut back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    n, heads, dk = q.shape
    length, kv_heads, dv = values.shape
    k, v = keys.to(q.dtype), values.to(q.dtype)
    if heads != kv_heads:
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    if dv < dk:
        v = F.pad(v, (0, dk - dv))
    qt, kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, len, d]
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with sdpa_kernel(backends):
        if prefix_len:
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(n, length), scale=scale)
        else:
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    return out[0].transpose(0, 1)[..., :dv].contiguous()


def causal_extend_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix_len: int,
                            scale: float) -> torch.Tensor:
    """The kernel for q's device: fused SDPA on CUDA, the float32 torch reference elsewhere (shape only on meta)."""
    if q.device.type == "meta":
        return torch.empty(*q.shape[:2], values.shape[-1], dtype=q.dtype, device=q.device)
    if q.is_cuda:
        return causal_extend_attention_cuda(q, keys, values, prefix_len, scale)
    return causal_extend_attention_torch(q, keys, values, prefix_len, scale)
