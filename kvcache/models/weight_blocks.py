"""Weight blocks: the parameter tensors of one module (attention, MLP, experts, Mamba-2...), per rank.

Each block is a frozen record of the sizes the config gave, and `specs(name, shard)` lists
its tensors as this rank holds them. Tensor parallelism, as SGLang and vLLM shard:
column-parallel outputs (q/k/v, gate/up, experts' intermediate, in-projections) and
row-parallel inputs (o/down/out) split by tp_size, rounded up; a rank holds
max(1, kv_heads // tp_size) KV heads; norms, routers and small replicated linears stay whole.
Shapes are [out, in] like torch.nn.Linear; a layer's routed experts are two stacked tensors,
gate_up [experts, 2 * intermediate, hidden] and down [experts, hidden, intermediate].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol
from kvcache.arithmetic import ceil_div


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter tensor as this rank holds it; `quantized` marks a linear weight stored narrow."""

    name: str
    shape: tuple[int, ...]
    quantized: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Shard:
    """Per-rank sizes under tensor parallelism."""

    tp: int

    def split(self, n: int) -> int:
        """A column-, row- or vocab-parallel dimension: ceil(n / tp)."""
        return ceil_div(n, self.tp)

    def kv_heads(self, n: int) -> int:
        """KV heads per rank; replicated to one when there are fewer heads than ranks."""
        return max(1, n // self.tp)


class Block(Protocol):
    """Anything that lists its tensors under a module name."""

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]: ...


def linear(name: str, out: int, inp: int, *, bias: bool = False, quantizable: bool = True) -> list[ParamSpec]:
    """A Linear's weight (quantizable unless said otherwise) and optional bias."""
    specs = [ParamSpec(f"{name}.weight", (out, inp), quantizable)]
    return specs + [ParamSpec(f"{name}.bias", (out,), False)] if bias else specs


@dataclass(frozen=True, slots=True)
class Norm:
    """An RMSNorm or LayerNorm weight (and bias for LayerNorm), replicated."""

    size: int
    bias: bool = False

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        out = [ParamSpec(f"{name}.weight", (self.size,))]
        return out + [ParamSpec(f"{name}.bias", (self.size,))] if self.bias else out


@dataclass(frozen=True, slots=True)
class Linear:
    """A replicated linear (EAGLE's fc, MTP's eh_proj, a shared-expert gate); `column_parallel` splits its
    outputs over the ranks instead (Nemotron-3's MTP eh_proj)."""

    out: int
    inp: int
    bias: bool = False
    quantizable: bool = False
    column_parallel: bool = False

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        out = shard.split(self.out) if self.column_parallel else self.out
        return linear(name, out, self.inp, bias=self.bias, quantizable=self.quantizable)


@dataclass(frozen=True, slots=True)
class Attention:
    """MHA/GQA: q/k/v/o (q doubled when `gated`: Qwen3-Next's output gate); o's bias is whole."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    input_size: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    gated: bool = False
    sinks: bool = False

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        q = shard.split(self.heads) * self.head_dim
        kv = shard.kv_heads(self.kv_heads) * self.head_dim
        out = linear(f"{name}.q_proj", q * (2 if self.gated else 1), self.input_size, bias=self.qkv_bias)
        out += linear(f"{name}.k_proj", kv, self.input_size, bias=self.qkv_bias)
        out += linear(f"{name}.v_proj", kv, self.input_size, bias=self.qkv_bias)
        out += linear(f"{name}.o_proj", self.hidden, q, bias=self.o_bias)
        if self.qk_norm:
            out += [ParamSpec(f"{name}.q_norm.weight", (self.head_dim,)), ParamSpec(f"{name}.k_norm.weight", (self.head_dim,))]
        if self.sinks:
            out.append(ParamSpec(f"{name}.sinks", (shard.split(self.heads),)))
        return out


@dataclass(frozen=True, slots=True)
class Indexer:
    """DeepSeek-V3.2's lightning indexer: q from the q latent, one shared key head, per-head weights."""

    hidden: int
    q_lora_rank: int
    heads: int
    head_dim: int

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        return (linear(f"{name}.wq_b", self.heads * self.head_dim, self.q_lora_rank)
                + linear(f"{name}.wk", self.head_dim, self.hidden, quantizable=False)
                + Norm(self.head_dim, bias=True).specs(f"{name}.k_norm", shard)
                + linear(f"{name}.weights_proj", self.heads, self.hidden, quantizable=False))


@dataclass(frozen=True, slots=True)
class MLAttention:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi): low-rank q (optional) and kv, per-head up-projections."""

    hidden: int
    heads: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    kv_lora_rank: int
    q_lora_rank: int | None
    indexer: Indexer | None = None

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        h, qk = shard.split(self.heads), self.nope_dim + self.rope_dim
        if self.q_lora_rank is None:
            out = linear(f"{name}.q_proj", h * qk, self.hidden)
        else:
            out = (linear(f"{name}.q_a_proj", self.q_lora_rank, self.hidden)
                   + Norm(self.q_lora_rank).specs(f"{name}.q_a_layernorm", shard)
                   + linear(f"{name}.q_b_proj", h * qk, self.q_lora_rank))
        out += (linear(f"{name}.kv_a_proj_with_mqa", self.kv_lora_rank + self.rope_dim, self.hidden)
                + Norm(self.kv_lora_rank).specs(f"{name}.kv_a_layernorm", shard)
                + linear(f"{name}.kv_b_proj", h * (self.nope_dim + self.v_dim), self.kv_lora_rank)
                + linear(f"{name}.o_proj", self.hidden, h * self.v_dim))
        return out + (self.indexer.specs(f"{name}.indexer", shard) if self.indexer else [])


@dataclass(frozen=True, slots=True)
class GatedMLP:
    """SwiGLU/GeGLU MLP: gate, up, down."""

    hidden: int
    intermediate: int
    bias: bool = False

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        i = shard.split(self.intermediate)
        return (linear(f"{name}.gate_proj", i, self.hidden, bias=self.bias)
                + linear(f"{name}.up_proj", i, self.hidden, bias=self.bias)
                + linear(f"{name}.down_proj", self.hidden, i, bias=self.bias))


@dataclass(frozen=True, slots=True)
class PlainMLP:
    """A two-matrix MLP (GELU or squared ReLU): up, down."""

    hidden: int
    intermediate: int
    bias: bool = False

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        i = shard.split(self.intermediate)
        return linear(f"{name}.up_proj", i, self.hidden, bias=self.bias) + linear(f"{name}.down_proj", self.hidden, i, bias=self.bias)


@dataclass(frozen=True, slots=True)
class MoE:
    """A router, stacked routed experts (TP splits each expert's intermediate), optional shared experts."""

    hidden: int
    experts: int
    intermediate: int
    shared_intermediate: int = 0
    router_name: str = "gate"
    router_bias: bool = False
    score_bias: bool = False
    expert_bias: bool = False
    shared_name: str = "shared_experts"
    shared_gate: bool = False
    gated: bool = True  # False: squared-ReLU experts with up/down only (Nemotron-3)
    latent: int = 0  # Nemotron-3 Super/Ultra: experts work in a smaller latent, projected in and out

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        n, i = self.experts, shard.split(self.intermediate)
        out = linear(f"{name}.{self.router_name}", n, self.hidden, bias=self.router_bias, quantizable=False)
        if self.score_bias:
            out.append(ParamSpec(f"{name}.{self.router_name}.e_score_correction_bias", (n,)))
        width = self.latent or self.hidden
        if self.latent:
            out += linear(f"{name}.fc1_latent_proj", self.latent, self.hidden) + linear(f"{name}.fc2_latent_proj", self.hidden, self.latent)
        up = ("gate_up_proj", 2 * i) if self.gated else ("up_proj", i)
        out += [ParamSpec(f"{name}.experts.{up[0]}", (n, up[1], width), True),
                ParamSpec(f"{name}.experts.down_proj", (n, width, i), True)]
        if self.expert_bias:
            out += [ParamSpec(f"{name}.experts.gate_up_proj_bias", (n, 2 * i)),
                    ParamSpec(f"{name}.experts.down_proj_bias", (n, self.hidden))]
        if self.shared_intermediate:
            shared = GatedMLP if self.gated else PlainMLP
            out += shared(self.hidden, self.shared_intermediate).specs(f"{name}.{self.shared_name}", shard)
            if self.shared_gate:
                out += linear(f"{name}.shared_expert_gate", 1, self.hidden, quantizable=False)
        return out


@dataclass(frozen=True, slots=True)
class Mamba2Mixer:
    """Mamba-2: in_proj to [z, x, B, C, dt], a depthwise conv over [x, B, C], per-head dt/A/D, gated norm."""

    hidden: int
    heads: int
    head_dim: int
    groups: int
    state: int
    conv_kernel: int
    conv_bias: bool = True
    proj_bias: bool = False
    gated_norm: bool = True  # Falcon-H1 may leave the gated RMSNorm out (mamba_rms_norm false)

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        heads = shard.split(self.heads)
        inner = heads * self.head_dim
        bc = 2 * shard.kv_heads(self.groups) * self.state
        conv = [ParamSpec(f"{name}.conv1d.weight", (inner + bc, 1, self.conv_kernel))]
        if self.conv_bias:
            conv.append(ParamSpec(f"{name}.conv1d.bias", (inner + bc,)))
        per_head = [ParamSpec(f"{name}.{n}", (heads,)) for n in ("dt_bias", "A_log", "D")]
        return (linear(f"{name}.in_proj", 2 * inner + bc + heads, self.hidden, bias=self.proj_bias) + conv + per_head
                + ([ParamSpec(f"{name}.norm.weight", (inner,))] if self.gated_norm else [])
                + linear(f"{name}.out_proj", self.hidden, inner, bias=self.proj_bias))


@dataclass(frozen=True, slots=True)
class GatedDeltaNet:
    """Qwen3-Next linear attention: fused q/k/v/z and b/a projections, a depthwise conv over q/k/v, per-head decay."""

    hidden: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        kh, vh = shard.split(self.key_heads), shard.split(self.value_heads)
        kd, vd = self.key_dim, self.value_dim
        conv_dim = 2 * kh * kd + vh * vd
        return (linear(f"{name}.in_proj_qkvz", 2 * kh * kd + 2 * vh * vd, self.hidden)
                + linear(f"{name}.in_proj_ba", 2 * vh, self.hidden)
                + [ParamSpec(f"{name}.conv1d.weight", (conv_dim, 1, self.conv_kernel)),
                   ParamSpec(f"{name}.dt_bias", (vh,)), ParamSpec(f"{name}.A_log", (vh,)),
                   ParamSpec(f"{name}.norm.weight", (vd,))]
                + linear(f"{name}.out_proj", self.hidden, vh * vd))


Part = tuple[str, Block]


@dataclass(frozen=True, slots=True)
class Layer:
    """One decoder layer: its modules in order, each under a name relative to the layer's prefix."""

    parts: tuple[Part, ...]

    def specs(self, prefix: str, shard: Shard) -> list[ParamSpec]:
        return [spec for name, block in self.parts for spec in block.specs(prefix + name, shard)]
