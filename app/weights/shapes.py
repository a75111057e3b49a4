"""A model's parameter tensors on this rank, from its one description (`kvcache.models`).

`parameter_specs` and `count_parameters` take a ModelConfig (what the runner has) or a raw
HF config dict, which is read through the same registry first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvcache.inputs.parallel import ParallelState
from kvcache.models.model_config import ModelConfig
from kvcache.models.weight_blocks import ParamSpec
from kvcache.models.hf_config import model_config_from_hf

__all__ = ["ParamSpec", "count_parameters", "parameter_count", "parameter_specs"]


def _model(source: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    return source if isinstance(source, ModelConfig) else model_config_from_hf(source)


def parameter_specs(
    source: ModelConfig | Mapping[str, Any], *, tp_size: int = 1, layer_start: int = 0, layer_end: int | None = None,
    include_embedding: bool = True, include_lm_head: bool = True, nextn: bool = False,
) -> tuple[ParamSpec, ...]:
    """This rank's parameter tensors: layers [layer_start, layer_end), the ends by the flags (see WeightLayout)."""
    return _model(source).weights.parameter_specs(
        tp_size=tp_size, layer_start=layer_start, layer_end=layer_end, include_embedding=include_embedding,
        include_lm_head=include_lm_head, nextn=nextn)


def count_parameters(source: ModelConfig | Mapping[str, Any], **ranks: Any) -> int:
    """Parameters this rank holds: the sum of parameter_specs' element counts."""
    return parameter_count(parameter_specs(source, **ranks))


def parameter_count(specs: Sequence[ParamSpec]) -> int:
    """The parameters (elements) these tensors hold."""
    return sum(spec.numel for spec in specs)


def rank_parameter_specs(model: ModelConfig, parallel_state: ParallelState) -> tuple[ParamSpec, ...]:
    """A rank's parameter tensors: its pipeline layers (the embedding on the first stage, the LM head on the last),
    its tensor-parallel shards; a target's own MTP draft holds its NEXTN layer."""
    p = parallel_state
    if model.nextn_of_target:
        return tuple(parameter_specs(model, tp_size=p.tp_size, nextn=True))
    layers = p.layer_range(model.num_hidden_layers)
    return tuple(parameter_specs(
        model, tp_size=p.tp_size, layer_start=layers.start, layer_end=layers.stop,
        include_embedding=p.is_first_pp_rank, include_lm_head=p.is_last_pp_rank,
    ))
