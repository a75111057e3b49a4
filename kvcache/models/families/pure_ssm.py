"""Pure state-space models: Mamba and Falcon-Mamba (Mamba-1), Mamba-2 (Mamba-Codestral). No attention layer.

Every layer is a norm and a mixer under `backbone.layers.{i}.` (embeddings `backbone.embeddings`, final norm
`backbone.norm_f`), as transformers names them. Their configs give no context length: SGLang 0.5.23
(`get_context_length`) and vLLM 0.34.0 (`_get_and_verify_max_len`) both take 2048 then.
"""

from __future__ import annotations

from kvcache.models.decoder import Heads, ModelSource, describe, hidden_size, num_layers, weight_layout
from kvcache.models.families.mamba_hybrids import Mamba1Mixer, mamba1_cache_fields
from kvcache.models.families.nemotron_h import mamba2_cache_fields, mamba2_mixer
from kvcache.models.fields import MAX_HEAD_DIM, MAX_HEADS, ConfigFields
from kvcache.models.model_config import ModelConfig
from kvcache.models.weight_blocks import Block, Layer, Norm
from kvcache.arithmetic import ceil_div

DEFAULT_CONTEXT_LENGTH = 2048  # both engines' length for a config that states none
_LAYOUT = dict(embed_name="backbone.embeddings", final_norm="backbone.norm_f", layer_prefix="backbone.layers.{i}.")


def _no_attention(hidden: int) -> Heads:
    """A model without attention: no heads (SGLang 0.5.23 sets head_dim 0 and no KV heads for them)."""
    return Heads(hidden=hidden, heads=0, kv_heads=0, head_dim=0)


def _describe(src: ModelSource, mixer: Block, hidden: int, cache: dict[str, int]) -> ModelConfig:
    t = src.text
    n = num_layers(t)
    layer = Layer((("norm", Norm(hidden)), ("mixer", mixer)))
    weights = weight_layout(src, (layer,) * n, hidden, tied_default=True, **_LAYOUT)
    return describe(src, kinds=("mamba2",) * n, heads=_no_attention(hidden), weights=weights,
                    default_positions=DEFAULT_CONTEXT_LENGTH, **cache)


def _inner(t: ConfigFields, hidden: int) -> int:
    """Mamba-1's width: intermediate_size where given (it wins over expand x hidden in transformers, SGLang and vLLM:
    Falcon-Mamba-7B states expand 16 and intermediate_size 8192 at hidden 4096), else expand x hidden."""
    return t.int("intermediate_size", default=t.int("expand", default=2, high=64) * hidden)


def read_mamba(src: ModelSource) -> ModelConfig:
    """Mamba-1 (MambaForCausalLM; FalconMambaForCausalLM, whose dt/B/C RMSNorms carry no weight)."""
    t = src.text
    hidden = hidden_size(t)
    rank = t.raw.get("time_step_rank", "auto")
    dt_rank = ceil_div(hidden, 16) if rank == "auto" else t.int("time_step_rank", high=hidden)
    mixer = Mamba1Mixer(hidden=hidden, inner=_inner(t, hidden), state=t.int("state_size", high=MAX_HEAD_DIM),
                        conv_kernel=t.conv_kernel("conv_kernel"), dt_rank=dt_rank, bcdt_norms=False,
                        conv_bias=t.flag("use_conv_bias", default=True), proj_bias=t.flag("use_bias"))
    return _describe(src, mixer, hidden, mamba1_cache_fields(mixer))


def read_mamba2(src: ModelSource) -> ModelConfig:
    """Mamba-2 (Mamba2ForCausalLM): heads x head_dim is the mixer's width, expand x hidden."""
    t = src.text
    hidden = hidden_size(t)
    heads, head_dim = t.int("num_heads", high=MAX_HEADS), t.int("head_dim", high=MAX_HEAD_DIM)
    inner = t.int("expand", default=2, high=64) * hidden
    if heads * head_dim != inner:
        t.fail("num_heads", heads, f"expand x hidden_size / head_dim = {inner} / {head_dim} (the mixer's width)")
    if t.has("intermediate_size") and t.int("intermediate_size") != inner:  # SGLang sizes the conv state by it,
        t.fail("intermediate_size", t.int("intermediate_size"),  # vLLM and transformers by expand x hidden_size
               f"expand x hidden_size = {inner}, the width both engines must agree on")
    mixer = mamba2_mixer(t, hidden, heads=heads, head_dim=head_dim)
    return _describe(src, mixer, hidden, mamba2_cache_fields(mixer))
