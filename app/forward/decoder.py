"""Reference decoders for one rank with dummy weights: Llama/Qwen/Mistral (GQA) and DeepSeek (MLA).

Parameter names are those of app.weights (the Hugging Face checkpoint names). A decoder
maps a DecodeBatch or an ExtendBatch (prefill) to float32 logits [rows, vocab] (a prefill:
each request's last token, or every token when logprobs are asked for); attention goes
through an AttentionBackend (the pools in the engine, dense history in tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from app.forward.layers import RotaryAngles, dense_moe, gated_mlp, linear, rms_norm, rope_inv_freq, rotary, routed_moe
from app.forward.pool_attention import AttentionBackend, ForwardBatch
from kvcache.errors import UnsupportedModelError
from kvcache.models.model_config import ModelConfig

GQA_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3"})


class Decoder:
    """What both families share: the layer ids, the embedding, the final norm and lm_head."""

    def __init__(self, *, model_config: ModelConfig, weights: Mapping[str, torch.Tensor], attention: AttentionBackend,
                 layer_ids: range | None = None) -> None:
        self.config = model_config
        self.hf = model_config.hf_config
        self.weights = weights
        self.attention = attention
        self.layer_ids = layer_ids if layer_ids is not None else range(model_config.num_hidden_layers)
        self.eps = float(self.hf.get("rms_norm_eps", 1e-6))
        narrow = [(n, t.dtype) for n, t in weights.items() if not t.dtype.is_floating_point]  # fp8/mxfp4 bytes, packed ints
        if narrow:
            name, dtype = narrow[0]
            raise UnsupportedModelError(f"the reference decode runs unquantized weights; {name} is stored as {dtype}")
        device = next(iter(weights.values())).device if weights else torch.device("cpu")
        self.inv_freq = rope_inv_freq(self.rotary_dim, float(self.hf.get("rope_theta", 10000.0)), device)

    @property
    def rotary_dim(self) -> int:
        """How many dimensions of a head RoPE rotates."""
        raise NotImplementedError

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.weights["model.embed_tokens.weight"][batch.input_ids]
        angles = RotaryAngles.at(batch.positions, self.inv_freq)
        for layer in self.layer_ids:
            x = self.layer(layer, x, batch, angles)
        if batch.logit_rows is not None:
            x = x[batch.logit_rows]
        x = rms_norm(x, self.weights["model.norm.weight"], self.eps)
        head = self.weights.get("lm_head.weight", self.weights["model.embed_tokens.weight"])
        return torch.nn.functional.linear(x, head).float()

    def layer(self, layer: int, x: torch.Tensor, batch: ForwardBatch, angles: RotaryAngles) -> torch.Tensor:
        raise NotImplementedError


class GQADecoder(Decoder):
    """Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k RMSNorm over head_dim)."""

    @property
    def rotary_dim(self) -> int:
        return self.config.head_dim

    def layer(self, layer: int, x: torch.Tensor, batch: ForwardBatch, angles: RotaryAngles) -> torch.Tensor:
        c, w, p = self.config, self.weights, f"model.layers.{layer}."
        bs, d = x.shape[0], c.head_dim
        h = rms_norm(x, w[f"{p}input_layernorm.weight"], self.eps)
        q = linear(h, w, f"{p}self_attn.q_proj").view(bs, -1, d)
        k = linear(h, w, f"{p}self_attn.k_proj").view(bs, -1, d)
        v = linear(h, w, f"{p}self_attn.v_proj").view(bs, -1, c.v_head_dim)
        if f"{p}self_attn.q_norm.weight" in w:
            q = rms_norm(q, w[f"{p}self_attn.q_norm.weight"], self.eps)
            k = rms_norm(k, w[f"{p}self_attn.k_norm.weight"], self.eps)
        q, k = rotary(q, angles), rotary(k, angles)
        o = self.attention.gqa(layer, q, k, v, batch, d ** -0.5)
        x = x + linear(o.reshape(bs, -1), w, f"{p}self_attn.o_proj")
        h = rms_norm(x, w[f"{p}post_attention_layernorm.weight"], self.eps)
        return x + gated_mlp(h, w, f"{p}mlp.")


class MLADecoder(Decoder):
    """DeepSeek-V2/V3: MLA attention (absorbed in the pool backend); dense MLP first, then routed + shared experts.

    Routing is the plain top-k softmax of SGLang's greedy path; DeepSeek-V3's grouped
    sigmoid routing and YaRN's attention scale are not modelled (dummy weights). Experts run
    densely inside a CUDA-graph capture (static shapes) and routed (each on its own tokens)
    otherwise, so an eager prefill or a large eager decode costs what a fused MoE costs.
    """

    @property
    def rotary_dim(self) -> int:
        return int(self.hf["qk_rope_head_dim"])

    def layer(self, layer: int, x: torch.Tensor, batch: ForwardBatch, angles: RotaryAngles) -> torch.Tensor:
        hf, w, p = self.hf, self.weights, f"model.layers.{layer}."
        bs = x.shape[0]
        nope, rope, v_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"]), int(hf["v_head_dim"])
        rank = int(hf["kv_lora_rank"])
        h = rms_norm(x, w[f"{p}input_layernorm.weight"], self.eps)
        a = f"{p}self_attn."
        if f"{a}q_a_proj.weight" in w:
            q = linear(rms_norm(linear(h, w, f"{a}q_a_proj"), w[f"{a}q_a_layernorm.weight"], self.eps), w, f"{a}q_b_proj")
        else:
            q = linear(h, w, f"{a}q_proj")
        q = q.view(bs, -1, nope + rope)
        q_nope, q_pe = q[..., :nope], rotary(q[..., nope:].contiguous(), angles)
        kv_a = linear(h, w, f"{a}kv_a_proj_with_mqa")
        c_kv = rms_norm(kv_a[:, :rank], w[f"{a}kv_a_layernorm.weight"], self.eps)
        k_pe = rotary(kv_a[:, None, rank:].contiguous(), angles)
        w_kv_b = w[f"{a}kv_b_proj.weight"].view(-1, nope + v_dim, rank)
        o = self.attention.mla(layer, q_nope, q_pe, c_kv, k_pe, w_kv_b[:, :nope], w_kv_b[:, nope:], batch,
                               (nope + rope) ** -0.5)
        x = x + linear(o.reshape(bs, -1), w, f"{a}o_proj")
        h = rms_norm(x, w[f"{p}post_attention_layernorm.weight"], self.eps)
        return x + self._mlp(layer, h, f"{p}mlp.")

    def _mlp(self, layer: int, h: torch.Tensor, p: str) -> torch.Tensor:
        if f"{p}experts.gate_up_proj" not in self.weights:
            return gated_mlp(h, self.weights, p)
        hf = self.hf
        static = h.device.type == "meta" or (h.is_cuda and torch.cuda.is_current_stream_capturing())
        moe = dense_moe if static else routed_moe
        out = moe(h, self.weights, p, top_k=int(hf.get("num_experts_per_tok", 1)),
                        renormalize=bool(hf.get("norm_topk_prob", False)),
                        scaling=float(hf.get("routed_scaling_factor", 1.0)))
        if f"{p}shared_experts.gate_proj.weight" in self.weights:
            out = out + gated_mlp(h, self.weights, f"{p}shared_experts.")
        return out


def build_decoder(*, model_config: ModelConfig, weights: Mapping[str, torch.Tensor], attention: Any,
                  layer_ids: range | None = None) -> Decoder:
    """The reference decoder for this model family; UnsupportedModelError for the others."""
    kind = model_config.model_type
    if kind in GQA_MODEL_TYPES:
        return GQADecoder(model_config=model_config, weights=weights, attention=attention, layer_ids=layer_ids)
    if kind in MLA_MODEL_TYPES:
        return MLADecoder(model_config=model_config, weights=weights, attention=attention, layer_ids=layer_ids)
    supported = ", ".join(sorted(GQA_MODEL_TYPES | MLA_MODEL_TYPES))
    raise UnsupportedModelError(f"no reference decode for model_type {kind!r}; supported: {supported}")
