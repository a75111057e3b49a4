"""WeightLayout: a model's parameter tensors as the registry read them, and this rank's share of them.

The dummy loader allocates exactly `parameter_specs(...)`, so the bytes it reports are
the bytes a real checkpoint of the same architecture would occupy on this rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvcache.errors import ConfigError
from kvcache.models.quantization import Quantization
from kvcache.models.weight_blocks import Layer, Norm, Part, ParamSpec, Shard


@dataclass(frozen=True, slots=True)
class WeightLayout:
    """The layers (one `Layer` each, shared objects where layers are alike), the two ends, NEXTN layers, and
    `front`: modules outside the layer stack held with the embedding (a vision tower, Zamba-2's shared blocks)."""

    hidden: int
    vocab: int
    layers: tuple[Layer, ...]
    tied: bool
    layer_prefix: str = "model.layers.{i}."
    embed_name: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    lm_head_name: str = "lm_head"
    lm_head_vocab: int | None = None
    nextn_layers: tuple[Layer, ...] = ()
    nextn_prefix: str | None = None  # the MTP layers' own names ("mtp.layers.{i}."); None: numbered after the layers
    front: tuple[Part, ...] = ()
    quantization: Quantization = Quantization()

    def parameter_specs(
        self, *, tp_size: int = 1, layer_start: int = 0, layer_end: int | None = None,
        include_embedding: bool = True, include_lm_head: bool = True, nextn: bool = False,
    ) -> tuple[ParamSpec, ...]:
        """This rank's tensors: layers [layer_start, layer_end), the ends by the flags.

        The final norm lives with lm_head (the last pipeline stage); `front` with the embedding
        (the first stage). Tied embeddings count once, unless this stage has lm_head
        without the embedding. nextn=True: only the NEXTN/MTP layers (the range indexes
        them), which share the target's embedding and lm_head.
        """
        if tp_size < 1:
            raise ConfigError(f"tp_size must be at least 1, got {tp_size}")
        shard = Shard(tp_size)
        if nextn:
            if not self.nextn_layers:
                raise ConfigError("nextn=True but the config has no NEXTN (MTP) layers "
                                  "('num_nextn_predict_layers' / 'mtp_num_hidden_layers' is missing or 0)")
            ids = _checked_range(layer_start, layer_end, len(self.nextn_layers), "NEXTN layers")
            first = len(self.layers)
            specs = [s for k in ids for s in self.nextn_layers[k].specs(self._nextn_name(k, first), shard)]
            return self._quantized(specs)
        ids = _checked_range(layer_start, layer_end, len(self.layers), "layers")
        vocab = shard.split(self.vocab)
        specs: list[ParamSpec] = []
        if include_embedding:
            specs.append(ParamSpec(f"{self.embed_name}.weight", (vocab, self.hidden)))
            specs += [s for name, block in self.front for s in block.specs(name, shard)]
        specs += [s for i in ids for s in self.layers[i].specs(self.layer_prefix.format(i=i), shard)]
        if include_lm_head:
            specs += Norm(self.hidden).specs(self.final_norm, shard)
            head_vocab = vocab if self.lm_head_vocab is None else shard.split(self.lm_head_vocab)
            if not (self.tied and include_embedding and self.lm_head_vocab is None):
                specs.append(ParamSpec(f"{self.lm_head_name}.weight", (head_vocab, self.hidden)))
        return self._quantized(specs)

    def _nextn_name(self, k: int, first: int) -> str:
        """The k-th MTP layer's prefix: its own (Qwen3-Next's mtp., MiMo's model.mtp_layers.k.), else layer first + k."""
        return self.nextn_prefix.format(i=k) if self.nextn_prefix is not None else self.layer_prefix.format(i=first + k)

    def _quantized(self, specs: Sequence[ParamSpec]) -> tuple[ParamSpec, ...]:
        """Keep `quantized` only on quantizable weights the checkpoint's quantization covers."""
        return tuple(replace(s, quantized=self.quantization.covers(s.name)) if s.quantized else s for s in specs)


def _checked_range(start: int, end: int | None, count: int, what: str) -> range:
    stop = count if end is None else end
    if not 0 <= start <= stop <= count:
        raise ConfigError(f"layer range [{start}, {stop}) is outside the model's {count} {what}")
    return range(start, stop)
