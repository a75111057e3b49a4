"""The family registry: config.json -> ModelConfig (cache description + weight layout), read once.

Dispatch: the architecture (architectures[0]) or the language model's model_type picks a
family reader; a config that carries a family's unmistakable fields (kv_lora_rank,
hybrid_override_pattern, linear_attention layers) gets that family's reader; any other
decoder goes to the generic reader. Multimodal and wrapper configs (`text_config`,
`llm_config`, `language_config`) are read from their language model's section, with the
vision tower counted when its shapes are given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import msgspec

from kvcache.errors import UnsupportedModelError
from kvcache.models.model_config import ModelConfig
from kvcache.models.decoder import ModelSource
from kvcache.models.families.dbrx import read_dbrx
from kvcache.models.families.deepseek import read_deepseek
from kvcache.models.families.eagle import read_eagle, read_eagle3
from kvcache.models.families.gemma import read_gemma
from kvcache.models.families.gpt_oss import read_gpt_oss
from kvcache.models.families.kimi_linear import read_kimi_linear
from kvcache.models.families.llama4 import read_llama4
from kvcache.models.families.mimo import read_mimo
from kvcache.models.families.mamba_hybrids import read_bamba, read_falcon_h1, read_granite_hybrid, read_jamba, read_zamba2
from kvcache.models.families.nemotron_h import read_nemotron_h
from kvcache.models.families.pure_ssm import read_mamba, read_mamba2
from kvcache.models.families.qwen3_next import read_qwen3_next
from kvcache.models.fields import ConfigFields
from kvcache.models.generic import read_generic
from kvcache.models.vision import vision_tower

Reader = Callable[[ModelSource], ModelConfig]

# Families whose cache or weights are not a standard decoder's, by architecture and by model_type.
FAMILIES: dict[str, Reader] = {
    "Gemma2ForCausalLM": read_gemma, "Gemma3ForCausalLM": read_gemma, "Gemma3ForConditionalGeneration": read_gemma,
    "DeepseekV2ForCausalLM": read_deepseek, "DeepseekV3ForCausalLM": read_deepseek,
    "DeepseekV32ForCausalLM": read_deepseek, "KimiK2ForCausalLM": read_deepseek,
    "GptOssForCausalLM": read_gpt_oss,
    "Qwen3NextForCausalLM": read_qwen3_next, "Qwen3_5ForConditionalGeneration": read_qwen3_next,
    "Qwen3_5MoeForConditionalGeneration": read_qwen3_next, "Qwen3_5ForCausalLM": read_qwen3_next,
    "NemotronHForCausalLM": read_nemotron_h,
    "Llama4ForConditionalGeneration": read_llama4, "Llama4ForCausalLM": read_llama4,
    "FalconH1ForCausalLM": read_falcon_h1, "GraniteMoeHybridForCausalLM": read_granite_hybrid,
    "BambaForCausalLM": read_bamba, "Zamba2ForCausalLM": read_zamba2, "JambaForCausalLM": read_jamba,
    "KimiLinearForCausalLM": read_kimi_linear, "MiMoForCausalLM": read_mimo,
    "LlamaForCausalLMEagle": read_eagle, "LlamaForCausalLMEagle3": read_eagle3, "DbrxForCausalLM": read_dbrx,
    "MambaForCausalLM": read_mamba, "FalconMambaForCausalLM": read_mamba, "Mamba2ForCausalLM": read_mamba2,
}
MODEL_TYPES: dict[str, Reader] = {
    "gemma2": read_gemma, "gemma3": read_gemma, "gemma3_text": read_gemma,
    "deepseek_v2": read_deepseek, "deepseek_v3": read_deepseek, "deepseek_v32": read_deepseek, "kimi_k2": read_deepseek,
    "gpt_oss": read_gpt_oss, "qwen3_next": read_qwen3_next, "qwen3_5": read_qwen3_next,
    "qwen3_5_moe": read_qwen3_next, "qwen3_5_text": read_qwen3_next, "qwen3_5_moe_text": read_qwen3_next,
    "nemotron_h": read_nemotron_h, "llama4": read_llama4, "llama4_text": read_llama4, "falcon_h1": read_falcon_h1,
    "granitemoehybrid": read_granite_hybrid, "bamba": read_bamba, "zamba2": read_zamba2, "jamba": read_jamba,
    "kimi_linear": read_kimi_linear, "mimo": read_mimo, "dbrx": read_dbrx,
    "mamba": read_mamba, "falcon_mamba": read_mamba, "mamba2": read_mamba2,
}
# Architectures that look like decoders but whose cache no reader here describes.
UNSUPPORTED: dict[str, str] = {
    "RwkvForCausalLM": "an RWKV model (a recurrent state this engine does not size)",
    "RecurrentGemmaForCausalLM": "a Griffin model (RG-LRU state this engine does not size)",
    "xLSTMForCausalLM": "an xLSTM model (a recurrent state this engine does not size)",
    "DeepseekV4ForCausalLM": "DeepSeek-V4 (compressed sparse attention this engine does not size yet)",
    "Gemma4ForConditionalGeneration": "Gemma-4 (global layers of their own head_dim and KV sharing, not sized yet)",
    "Gemma4ForCausalLM": "Gemma-4 (global layers of their own head_dim and KV sharing, not sized yet)",
    "Gemma3nForConditionalGeneration": "Gemma-3n (per-layer embeddings and KV sharing, not sized yet)",
    "KimiK3ForConditionalGeneration": "Kimi-K3 (attention residuals and a latent MoE, not sized yet)",
    "MiMoV2FlashForCausalLM": "MiMo-V2-Flash (sliding layers with their own heads, not sized yet)",
    "DeciLMForCausalLM": "a Nemotron-NAS model (per-layer block_configs, not sized yet)",
    "MiniMaxM3SparseForCausalLM": "MiniMax-M3 sparse attention (not sized yet)",
    "MiniMaxM3SparseForConditionalGeneration": "MiniMax-M3 sparse attention (not sized yet)",
}
# Fields that mean the cache is not a standard decoder's: the generic reader refuses rather than guess.
_NON_STANDARD_FIELDS = ("block_configs", "compress_ratios", "swa_num_key_value_heads", "global_head_dim",
                        "num_kv_shared_layers", "hybrid_layer_pattern", "sparse_attention_config")
_WRAPPERS = ("text_config", "llm_config", "language_config")
# Wrappers whose composite model holds the LM head (lm_head.weight at the top of the checkpoint) and reads its own
# tie_word_embeddings, as SGLang 0.5.23 builds them: from the top-level config, onto which its get_config copies only
# the text fields the top lacks (models/qwen2_vl.py, qwen2_5_vl.py, qwen3_vl.py, whose Qwen3-VL-MoE and Qwen3.5 copy
# the wrapper's flag over their section's; glm4v.py, ernie45_vl.py). Every other wrapper builds a complete causal LM
# from its section, head included (llava.py for Mistral-3, gemma3_mm.py, mllama4.py, kimi_k25.py, step3p7.py), and
# that section's flag counts.
HEAD_ON_WRAPPER = frozenset({
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "Ernie4_5_VLMoeForConditionalGeneration",
})
_DECODER_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "Eagle", "Eagle3")


def _signalled(text: ConfigFields) -> Reader | None:
    """A family's unmistakable fields, for configs whose architecture is not in the table."""
    if text.has("hybrid_override_pattern"):
        return read_nemotron_h
    if text.has("kv_lora_rank"):
        return read_deepseek
    types = text.raw.get("layer_types")
    if isinstance(types, list) and "linear_attention" in types:
        return read_qwen3_next
    return None


def _architecture(top: ConfigFields) -> str:
    archs = top.raw.get("architectures")
    if archs is None or archs == []:
        raise UnsupportedModelError(f"{top.model}: config.json has no 'architectures' list, so its family is unknown")
    if not isinstance(archs, list) or not isinstance(archs[0], str) or not archs[0]:
        top.fail("architectures", archs, "a list of architecture names such as ['LlamaForCausalLM']")
    return archs[0]


def _refuse_non_decoders(top: ConfigFields, arch: str) -> None:
    if arch in UNSUPPORTED:
        raise UnsupportedModelError(f"{top.model}: architecture {arch!r} is {UNSUPPORTED[arch]}; not supported")
    if top.flag("is_encoder_decoder") or not arch.endswith(_DECODER_SUFFIXES):
        raise UnsupportedModelError(
            f"{top.model}: architecture {arch!r} is not a decoder-only language model; supported: any "
            f"*ForCausalLM / *ForConditionalGeneration decoder config, with its own reader for {', '.join(sorted(FAMILIES))}"
        )


def model_source(hf: Mapping[str, Any], *, name: str) -> ModelSource:
    """The config as a ModelSource: its architecture and the language model's section."""
    top = ConfigFields(hf, name)
    arch = _architecture(top)
    _refuse_non_decoders(top, arch)
    wrappers = [w for w in _WRAPPERS if top.has(w)]
    if len(wrappers) > 1:
        top.fail(wrappers[1], "a second language-model section", f"only one of {', '.join(wrappers)}: which is the model?")
    text = top.section(*_WRAPPERS)
    if text is not None:
        text = replace(text, outer=hf)
    return ModelSource(top=top, text=text or top, architecture=arch, model_type=top.text("model_type", default=""),
                       raw=dict(hf), wrapped=text is not None, head_on_wrapper=arch in HEAD_ON_WRAPPER)


def reader_for(src: ModelSource) -> Reader:
    """The family table by architecture, then by model_type, then the fields that signal a family, else generic."""
    if "Eagle3" in src.architecture:
        return read_eagle3
    text_type = src.text.text("model_type", default="")
    reader = (FAMILIES.get(src.architecture) or MODEL_TYPES.get(text_type) or MODEL_TYPES.get(src.model_type)
              or _signalled(src.text))
    if reader is not None:
        return reader
    unknown = [f for f in _NON_STANDARD_FIELDS if src.text.has(f)]
    if unknown:
        raise UnsupportedModelError(
            f"{src.name}: architecture {src.architecture!r} has {', '.join(map(repr, unknown))}, so its cache is not a "
            "standard decoder's and no reader here sizes it; not supported (README: how to add a family)")
    return read_generic


def read_model(hf: Mapping[str, Any], *, name: str) -> ModelConfig:
    """Read one config.json: the family's (or the generic) reader, then the vision tower when there is one."""
    src = model_source(hf, name=name)
    model = reader_for(src)(src)
    if not src.top.has("vision_config"):
        return model
    parts, counted = vision_tower(src.top, model.hidden_size)
    weights = model.weights
    if counted:
        weights = replace(weights, front=weights.front + parts)
    return msgspec.structs.replace(model, weights=weights, vision_weights="counted" if counted else "not_counted")
