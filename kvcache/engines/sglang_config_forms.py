"""Config files SGLang 0.5.23 refuses to load although they describe a model it serves: the forms transformers 5
writes for a few families. The plan is still SGLang's for that model (read from the form it does load); the
report says the file must be converted first, so no one takes the plan for a start that will run.

Each rule cites the SGLang 0.5.23 code that refuses (sglang 0.5.23 on PyPI, srt/configs/):
- nemotron_h.py `NemotronHConfig._validate_layers_block_type`: `layers_block_type` and
  `mtp_layers_block_type` entries must be mamba / attention / mlp / moe (ValueError otherwise);
- kimi_linear.py `KimiLinearConfig`: the KDA layers and heads come only from `linear_attn_config`; without it
  the model is not a linear-attention model there and its KDA cache cannot be built;
- dbrx.py `DbrxFFNConfig` / `DbrxAttentionConfig`: an `ffn_config` key it does not name is a ValueError
  ("Found unknown kwargs"), as transformers 5's `ffn_config.hidden_size` is.
"""

from __future__ import annotations

from typing import Any

from kvcache.models.model_config import ModelConfig

NEMOTRON_H_BLOCK_TYPES = frozenset({"mamba", "attention", "mlp", "moe"})
DBRX_FFN_KEYS = frozenset({"ffn_act_fn", "ffn_hidden_size", "moe_num_experts", "moe_top_k", "moe_jitter_eps",
                           "moe_loss_weight", "moe_normalize_expert_weights", "uniform_expert_assignment",
                           "model_type"})


def _nemotron_h(hf: dict[str, Any]) -> str | None:
    for key in ("layers_block_type", "mtp_layers_block_type"):
        types = hf.get(key)
        if isinstance(types, list) and (unknown := sorted(set(map(str, types)) - NEMOTRON_H_BLOCK_TYPES)):
            return (f"`{key}` holds {', '.join(unknown)} (transformers 5's names), and its NemotronHConfig accepts "
                    "only mamba / attention / mlp / moe: write the layers as `hybrid_override_pattern` or in those names")
    return None


def _kimi_linear(hf: dict[str, Any]) -> str | None:
    if hf.get("linear_attn_config") is None:
        return ("there is no `linear_attn_config`, the only place its KimiLinearConfig reads the KDA layers and heads "
                "from: add it (kda_layers / full_attn_layers 1-based, num_heads, head_dim, short_conv_kernel_size)")
    return None


def _dbrx(hf: dict[str, Any]) -> str | None:
    ffn = hf.get("ffn_config")
    if isinstance(ffn, dict) and (unknown := sorted(set(ffn) - DBRX_FFN_KEYS)):
        return (f"`ffn_config` holds {', '.join(unknown)}, which its DbrxFFNConfig refuses as unknown: remove "
                f"{'it' if len(unknown) == 1 else 'them'}")
    return None


RULES = {"nemotron_h": _nemotron_h, "kimi_linear": _kimi_linear, "dbrx": _dbrx}


def sglang_config_form_refusal(model: ModelConfig, label: str) -> str | None:
    """Why SGLang refuses this config file as written (None when it loads it)."""
    rule = RULES.get(str(model.hf_config.get("model_type", "")))
    why = rule(model.hf_config) if rule else None
    return None if why is None else (f"{label} refuses this config.json as written: {why}; the plan is what it would "
                                     "allocate for the same model once it loads")
