"""The decode step's building blocks in plain torch: norms, rotary embeddings, MLPs, a dense mixture of experts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in float32 and returned in x's dtype."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def linear(x: torch.Tensor, weights: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """x @ W.T (+ bias when the checkpoint has one) for the parameter `name`.weight."""
    return F.linear(x, weights[f"{name}.weight"], weights.get(f"{name}.bias"))


def rope_inv_freq(dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """RoPE's frequencies theta^(-2i/dim), float32 [dim / 2]: a model's decoder computes them once.

    Plain RoPE at rope_theta; a checkpoint's rope_scaling (llama3, YaRN) is not applied:
    the dummy weights carry no meaning that a scaled frequency would change.
    """
    return 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))


@dataclass(frozen=True, slots=True)
class RotaryAngles:
    """cos and sin [n, 1, dim] of one decode step's positions: computed once per step, used by every layer."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def at(cls, positions: torch.Tensor, inv_freq: torch.Tensor) -> "RotaryAngles":
        angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        return cls(cos=torch.cat((angles.cos(), angles.cos()), -1)[:, None, :],
                   sin=torch.cat((angles.sin(), angles.sin()), -1)[:, None, :])


def rotary(x: torch.Tensor, angles: RotaryAngles) -> torch.Tensor:
    """Rotary embedding (the rotate-half layout of HF Llama) of x [n, heads, dim] at the step's angles."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), -1)
    return (xf * angles.cos + rotated * angles.sin).to(x.dtype)


def gated_mlp(x: torch.Tensor, weights: Mapping[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)), the Llama/Qwen/DeepSeek dense MLP."""
    return linear(F.silu(linear(x, weights, f"{prefix}gate_proj")) * linear(x, weights, f"{prefix}up_proj"),
                  weights, f"{prefix}down_proj")


def dense_moe(x: torch.Tensor, weights: Mapping[str, torch.Tensor], prefix: str, *, top_k: int,
              renormalize: bool, scaling: float) -> torch.Tensor:
    """Routed experts computed densely: every expert runs on every token, weighted by the router's
    top-k softmax (zero elsewhere). Static shapes, so CUDA graphs capture it; a reference, not a fast MoE."""
    router = F.linear(x.float(), weights[f"{prefix}gate.weight"].float()).softmax(-1)
    top, idx = router.topk(top_k, dim=-1)
    if renormalize:
        top = top / top.sum(-1, keepdim=True)
    gates = torch.zeros_like(router).scatter_(-1, idx, top) * scaling  # [n, experts]
    gate_up = weights[f"{prefix}experts.gate_up_proj"]  # [experts, 2 * inter, hidden]
    down = weights[f"{prefix}experts.down_proj"]  # [experts, hidden, inter]
    h = torch.einsum("nh,eoh->eno", x, gate_up)
    g, u = h.chunk(2, dim=-1)
    y = torch.einsum("eni,ehi->enh", F.silu(g) * u, down)
    return torch.einsum("enh,ne->nh", y.float(), gates).to(x.dtype)


def routed_moe(x: torch.Tensor, weights: Mapping[str, torch.Tensor], prefix: str, *, top_k: int,
               renormalize: bool, scaling: float) -> torch.Tensor:
    """The same mixture as dense_moe, each expert run only on the tokens routed to it (tokens sorted by
    expert, as a fused MoE kernel groups them): activations grow with tokens x top_k, not tokens x experts.
    The per-expert counts are read on the host, so it runs eagerly (CUDA graphs capture dense_moe)."""
    router = F.linear(x.float(), weights[f"{prefix}gate.weight"].float()).softmax(-1)
    top, idx = router.topk(top_k, dim=-1)
    if renormalize:
        top = top / top.sum(-1, keepdim=True)
    gate_up = weights[f"{prefix}experts.gate_up_proj"]  # [experts, 2 * inter, hidden]
    down = weights[f"{prefix}experts.down_proj"]  # [experts, hidden, inter]
    flat = idx.reshape(-1)
    order = flat.argsort(stable=True)
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)[order]
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    rows = x[token]
    out = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            g, u = F.linear(rows[start:start + count], gate_up[expert]).chunk(2, dim=-1)
            out[start:start + count] = F.linear(F.silu(g) * u, down[expert])
        start += count
    weighted = out.float() * (top.reshape(-1)[order] * scaling)[:, None]
    return torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, token, weighted).to(x.dtype)
