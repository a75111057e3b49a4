"""SGLang 0.5.23: which models get separate full and sliding-window pools (its "hybrid SWA memory").

SGLang builds the two pools only when `is_hybrid_swa_model` (python/sglang/srt/configs/model_config.py)
lists the architecture and `disable_hybrid_swa_memory` is off (`ModelConfig._derive_hybrid_model`); its
model-override table sets that switch for some architectures whatever the flag says
(srt/arg_groups/model_overrides/gemma2_gemma3.py, olmo2.py). Every other model, Mistral-7B-v0.1 and
Phi-3 with their sliding windows included, keeps every layer in one full pool of every token.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvcache.models.model_config import ModelConfig

# is_hybrid_swa_model's set, with SWA_SINK_ARCHS and MIMO_V2_MODEL_ARCHS written out
HYBRID_SWA_ARCHITECTURES = frozenset({
    "BeamForCausalLM", "Llama4ForConditionalGeneration",
    "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark",
    # SWA_SINK_ARCHS
    "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM", "IQuestQ1MTP",
    # MIMO_V2_MODEL_ARCHS
    "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM",
    "MiMoV2MTP", "Step3p5ForCausalLM", "Step3p5MTP", "Step3p7ForConditionalGeneration",
    "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration",
    "DiffusionGemmaForBlockDiffusion", "LagunaForCausalLM", "MellumForCausalLM",
    "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration",
    "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP", "UnlimitedOCRForCausalLM",
})

# Model overrides that force disable_hybrid_swa_memory, unconditionally: architecture -> the override's file
ONE_FULL_POOL_OVERRIDES: Mapping[str, str] = {
    "Gemma2ForCausalLM": "gemma2_gemma3.py", "Gemma3ForCausalLM": "gemma2_gemma3.py",
    "Gemma3ForConditionalGeneration": "gemma2_gemma3.py", "Gemma3nForCausalLM": "gemma2_gemma3.py",
    "Gemma3nForConditionalGeneration": "gemma2_gemma3.py", "Olmo2ForCausalLM": "olmo2.py",
}


def architectures(model: ModelConfig) -> tuple[str, ...]:
    """config.json's `architectures` (SGLang checks every entry), or the one the reader settled on."""
    listed = model.hf_config.get("architectures")
    return tuple(listed) if isinstance(listed, list) and listed else (model.architecture,)


def text_config(model: ModelConfig) -> Mapping[str, Any]:
    """The language model's config: `text_config` of a multimodal wrapper, else the whole config."""
    text = model.hf_config.get("text_config")
    return text if isinstance(text, dict) else model.hf_config


def is_hybrid_swa_model(model: ModelConfig) -> bool:
    """SGLang 0.5.23's is_hybrid_swa_model: a listed architecture (Beam only with a sliding layer, Laguna only
    with a sliding window), or a text config that opts in with `is_hybrid_swa`."""
    archs, text = architectures(model), text_config(model)
    if any(a in HYBRID_SWA_ARCHITECTURES for a in archs):
        if "BeamForCausalLM" in archs:
            return "sliding_attention" in (text.get("layer_types") or ())
        if "LagunaForCausalLM" in archs and not text.get("sliding_window"):
            return False
        return True
    return bool(text.get("is_hybrid_swa", False))


def one_full_pool_override(model: ModelConfig) -> str | None:
    """The override file that forces one full pool for this model's architecture (its first, as SGLang keys it)."""
    return ONE_FULL_POOL_OVERRIDES.get(architectures(model)[0])
