"""A decoder layer's feed-forward, as its config states it: a dense MLP (gated or plain), or routed experts
(with shared ones, a latent, a score bias), and which layers route: one reading of every alias for every family.
"""

from __future__ import annotations

from typing import Any

from kvcache.arithmetic import ceil_div
from kvcache.models.fields import MAX_EXPERTS, ConfigFields
from kvcache.models.weight_blocks import Block, GatedMLP, MoE, PlainMLP

INTERMEDIATE_ALIASES = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")

_PLAIN_MLP_TYPES = frozenset({"gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "phi", "falcon", "opt", "gptj",
                              "bloom", "mpt", "codegen", "nemotron"})


def dense_mlp(f: ConfigFields, hidden: int, *, model_type: str) -> Block:
    """The dense MLP: gated (SwiGLU/GeGLU) unless the family's is a plain two-matrix one."""
    inter = f.int(*INTERMEDIATE_ALIASES)
    bias = f.flag("mlp_bias", "use_bias") or model_type in ("gpt2", "gpt_bigcode")
    return PlainMLP(hidden, inter, bias) if model_type in _PLAIN_MLP_TYPES else GatedMLP(hidden, inter, bias)


def experts_count(f: ConfigFields) -> int:
    """Routed experts per MoE layer; 0 for a dense model."""
    return f.int("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                 default=0, low=0, high=MAX_EXPERTS)


TOP_K_ALIASES = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_k", "top_k_experts")


def check_routing(f: ConfigFields, experts: int) -> None:
    """The router's numbers against the experts it routes to: each token's top-k at most the experts there are;
    grouped routing (DeepSeek-V3's n_group / topk_group) splits the experts evenly and picks top-k from the
    chosen groups. Nothing here changes a byte; a config that breaks them is not one model."""
    top_k = f.optional_int(*TOP_K_ALIASES, high=experts)
    groups = f.optional_int("n_group", high=experts)
    if groups is None:
        return
    if experts % groups:
        f.fail("n_group", groups, f"a divisor of the {experts} routed experts (each group holds as many)")
    chosen = f.int("topk_group", default=groups, high=groups)
    if top_k is not None and top_k > chosen * (experts // groups):
        f.fail("topk_group", chosen, f"enough groups of {experts // groups} experts for "
                                     f"num_experts_per_tok {top_k} (at least {ceil_div(top_k, experts // groups)})")


def moe_block(f: ConfigFields, hidden: int, experts: int, *, score_bias: bool = False, **names: Any) -> MoE:
    """Routed experts (moe_intermediate_size, else intermediate_size) and shared ones under their three spellings."""
    check_routing(f, experts)
    inter = f.int("moe_intermediate_size", *INTERMEDIATE_ALIASES)
    shared = f.optional_int("shared_expert_intermediate_size", low=0)
    gate = shared is not None and shared > 0
    if shared is None:
        shared = f.optional_int("moe_shared_expert_intermediate_size", low=0)
    if shared is None:
        count = f.int("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "num_shared_expert",
                      default=0, low=0, high=MAX_EXPERTS)
        shared = count * inter
    latent = f.int("moe_latent_size", default=0, low=0)
    return MoE(hidden, experts, inter, shared_intermediate=shared, score_bias=score_bias, latent=latent,
               **({"shared_name": "shared_expert", "shared_gate": True} if gate else {}), **names)


_MLP_LAYER_TYPES = {"dense": False, "sparse": True}
_ROUTING_SETTINGS = ("first_k_dense_replace", "moe_layer_start_index", "mlp_only_layers", "decoder_sparse_step",
                     "interleave_moe_layer_step", "moe_layer_freq", "moe_layer_interval")


def moe_layers(f: ConfigFields, n: int) -> tuple[bool, ...]:
    """Which of the n layers route to experts: transformers 5's `mlp_layer_types` (dense / sparse per layer), or
    after first_k_dense_replace, every moe_layer_freq-th / decoder_sparse_step-th / interleave_moe_layer_step-th,
    never the mlp_only_layers; a config with both must say the same in both. A model given experts routes to
    them in some layer: settings that leave every layer dense contradict the expert count."""
    listed = f.mapped_list("mlp_layer_types", table=_MLP_LAYER_TYPES, length=n)
    if listed is None:
        return _routed_by_settings(f, n)
    if any(f.has(name) for name in _ROUTING_SETTINGS) and listed != _routed_by_settings(f, n):
        f.fail("mlp_layer_types", list(f.raw["mlp_layer_types"]), "'sparse' exactly where first_k_dense_replace, "
               "mlp_only_layers, moe_layer_freq and decoder_sparse_step route to the experts, when both are given")
    if not any(listed):
        f.fail("mlp_layer_types", list(f.raw["mlp_layer_types"]), f"at least one 'sparse' of the {n} layers "
                                                                  "(the config gives experts)")
    return listed


def _routed_by_settings(f: ConfigFields, n: int) -> tuple[bool, ...]:
    """Routing from the older settings (every layer routes when none is given)."""
    first_dense = f.int("first_k_dense_replace", "moe_layer_start_index", default=0, low=0, high=n - 1)
    dense_only = set(f.int_list("mlp_only_layers", high=n - 1) or ())
    step = f.int("decoder_sparse_step", "interleave_moe_layer_step", default=1, high=n)
    if isinstance(f.raw.get("moe_layer_freq"), list):  # one 0/1 flag per layer (MiniMax-M3, MiMo-V2)
        flags = f.int_list("moe_layer_freq", low=0, high=1) or ()
        if len(flags) != n:
            f.fail("moe_layer_freq", f"a list of {len(flags)}", f"one 0/1 flag per layer ({n})")
        routed = tuple(bool(flags[i]) and i not in dense_only for i in range(n))
    else:
        freq = f.int("moe_layer_freq", "moe_layer_interval", default=1, high=n)
        routed = tuple(i >= first_dense and i not in dense_only and i % freq == 0 and (i + 1) % step == 0
                       for i in range(n))
    if not any(routed):
        f.fail("mlp_only_layers" if dense_only else "first_k_dense_replace", sorted(dense_only) or first_dense,
               f"settings that leave at least one of the {n} layers routing to the experts the config gives "
               "(first_k_dense_replace, mlp_only_layers, moe_layer_freq and decoder_sparse_step leave none)")
    return routed


def ffn_blocks(f: ConfigFields, hidden: int, n: int, *, model_type: str, score_bias: bool = False,
               **moe_names: Any) -> tuple[Block, ...]:
    """Each layer's MLP: the dense one, or the MoE block where the layer routes to experts."""
    experts = experts_count(f)
    if experts == 0:
        dense = dense_mlp(f, hidden, model_type=model_type)
        return (dense,) * n
    routed = moe_layers(f, n)
    moe = moe_block(f, hidden, experts, score_bias=score_bias, **moe_names)
    dense = dense_mlp(f, hidden, model_type=model_type) if not all(routed) else moe
    return tuple(moe if r else dense for r in routed)


# ---- layers and the model -------------------------------------------------------------------------
