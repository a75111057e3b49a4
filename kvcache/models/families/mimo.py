"""MiMo (Xiaomi): a Qwen2-style decoder (the generic reader) whose checkpoint adds MTP layers under
`model.mtp_layers.{i}.`: token and hidden norms, input_proj, a decoder layer like the last one, a final
norm. SGLang 0.5.23 drafts with one (MiMoMTP), so a config asking for more is refused.
"""

from __future__ import annotations

from kvcache.models.model_config import ModelConfig
from kvcache.models.decoder import ModelSource, with_mtp
from kvcache.models.generic import read_generic
from kvcache.models.weight_blocks import Layer, Linear, Norm


def read_mimo(src: ModelSource) -> ModelConfig:
    model = read_generic(src)
    if not src.text.int("num_nextn_predict_layers", default=0, low=0, high=1):
        return model
    hidden, norm = model.hidden_size, Norm(model.hidden_size)
    mtp = Layer((("token_layernorm", norm), ("hidden_layernorm", norm), ("input_proj", Linear(hidden, 2 * hidden)),
                 *model.weights.layers[-1].parts, ("final_layernorm", norm)))
    return with_mtp(model, (mtp,), model.layer_kinds[-1:], prefix="model.mtp_layers.{i}.")
