"""A Triton paged-decode attention kernel: one program per (request, KV head), online softmax over pages.

K/V rows are found through req_to_token (the request's row, positions 0..seq_len-1),
so the kernel reads the pool in place, whatever the page size. Query heads that
share a KV head are computed together (grouped-query attention; MLA's absorbed form
is one KV head of dimension kv_lora_rank + rope whose first kv_lora_rank elements
are the values). A head dimension that is not a power of two (MLA's 576) is split
into a power-of-two part and a rest. FP8 buffers are read as FP8 and widened in
registers. Nothing syncs with the host, so CUDA graphs capture it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 16  # tokens per step of the loop
MIN_DOT = 16  # tl.dot needs every dimension >= 16


@triton.jit
def _paged_decode_kernel(
    Q, K, V, ReqToToken, ReqPoolIndices, SeqLens, Out, scale,
    stride_qb, stride_qh, stride_kr, stride_kh, stride_vr, stride_vh, stride_ob, stride_oh, stride_table,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DK: tl.constexpr,
    DPE: tl.constexpr, BLOCK_DPE: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + h
    head_ok = h < GROUP
    seq_len = tl.load(SeqLens + b)
    row = tl.load(ReqPoolIndices + b).to(tl.int64)

    d = tl.arange(0, DK)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=head_ok[:, None], other=0.0)
    q = q.to(tl.float32)
    if BLOCK_DPE > 0:
        dpe = DK + tl.arange(0, BLOCK_DPE)
        pe_ok = dpe < DK + DPE
        q_pe = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + dpe[None, :],
                       mask=head_ok[:, None] & pe_ok[None, :], other=0.0).to(tl.float32)
    dv = tl.arange(0, BLOCK_DV)
    dv_ok = dv < DV

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < seq_len
        tok = tl.load(ReqToToken + row * stride_table + n, mask=n_ok, other=0).to(tl.int64)
        k = tl.load(K + tok[None, :] * stride_kr + kv_head * stride_kh + d[:, None], mask=n_ok[None, :], other=0.0)
        scores = tl.dot(q, k.to(tl.float32), input_precision="ieee")
        if BLOCK_DPE > 0:
            k_pe = tl.load(K + tok[None, :] * stride_kr + kv_head * stride_kh + dpe[:, None],
                           mask=n_ok[None, :] & pe_ok[:, None], other=0.0)
            scores += tl.dot(q_pe, k_pe.to(tl.float32), input_precision="ieee")
        scores = tl.where(n_ok[None, :], scores * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(V + tok[:, None] * stride_vr + kv_head * stride_vh + dv[None, :],
                    mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        denom = denom * alpha + tl.sum(p, 1)
        m = m_new
    out = acc / denom[:, None]
    tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + dv[None, :], out.to(Out.dtype.element_ty),
             mask=head_ok[:, None] & dv_ok[None, :])


def _split_head_dim(dk: int) -> tuple[int, int]:
    """(power-of-two part, rest): 128 -> (128, 0); MLA's 576 -> (512, 64)."""
    main = 1 << (dk.bit_length() - 1)
    return main, dk - main


def paged_decode_attention_triton(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Same contract as paged_decode_attention_torch: q [bs, heads, dk] -> [bs, heads, dv] in q's dtype."""
    bs, heads, dk = q.shape
    kv_heads, dv = k_buffer.shape[1], v_buffer.shape[2]
    group = heads // kv_heads
    main, rest = _split_head_dim(dk)
    if main < MIN_DOT:
        raise ValueError(f"the Triton decode kernel needs a head dimension of at least {MIN_DOT}, got {dk}")
    q = q.contiguous()
    out = torch.empty(bs, heads, dv, dtype=q.dtype, device=q.device)
    if bs == 0:
        return out
    _paged_decode_kernel[(bs, kv_heads)](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, out, scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1), req_to_token.stride(0),
        GROUP=group, BLOCK_H=max(MIN_DOT, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N, DK=main,
        DPE=rest, BLOCK_DPE=triton.next_power_of_2(rest) if rest else 0, DV=dv,
        BLOCK_DV=max(MIN_DOT, triton.next_power_of_2(dv)), num_warps=8 if main >= 256 else 4,
    )
    return out
