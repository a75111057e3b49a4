"""SGLang 0.5.23's memory rules for multimodal models: when the multimodal side is on, and what it keeps back.

Facts from SGLang 0.5.23 (python/sglang/srt/...):
- configs/model_config.py `ModelConfig.__init__`: `--enable-multimodal` unset turns the multimodal side off
  for the architectures listed in MULTIMODAL_OFF_BY_DEFAULT (MiMo-V2 too, unless its config has both a
  vision_config and an audio_config), on for every other; `is_multimodal` then needs the side on, neither
  `--language-model-only` nor config.json's `language_model_only`, and a multimodal architecture
  (`is_multimodal_model`) or a language-model sub-config (thinker/llm/language/text_config, as
  utils/hf_transformers/common.py `get_hf_text_config` picks it) or DeepSeek-V4.1's vision layers.
- arg_groups/memory_hook.py `handle_gpu_memory_settings` and `adjust_mem_fraction_for_vlm`: a derived
  mem_fraction_static (not one the user gives) of such a model is multiplied by 0.95 times a ViT-size factor
  1 - 0.1 * (layers * hidden^2 / (24 * 1024^2) - 1), clamped to [0.8, 1.05], read from the top-level
  vision_config's `num_hidden_layers` and `hidden_size` (24 and 1024 where absent; no vision_config: no cut);
  with post-capture KV sizing it is lowered by 8 GiB of the card instead.
- arg_groups/cuda_graph_hook.py `disable_breakable_cudagraph_if_incompatible`: a multimodal model off the
  breakable-prefill-graph allowlist (`is_multimodal_breakable_cuda_graph_supported`) captures no prefill CUDA
  graphs, so their reserve (`reserve_for_graph_mb`) is not kept.
- mem_cache/kv_cache_configurator.py `mm_runtime_reservation_gb`: SGLANG_VLM_CACHE_SIZE_MB (100 MiB by
  default; the project has no environment knobs, so it is that default) comes out of the KV budget, for the
  multimodal embedding cache allocated after the KV cache is sized (CPU feature transport, the default).
The model implementation is SGLang's own (model_impl auto), not the Transformers backend.
"""

from __future__ import annotations

from fractions import Fraction

from kvcache.byte_units import MiB
from kvcache.engines.sglang_hybrid_swa import architectures
from kvcache.models.fields import MAX_LAYERS, ConfigFields
from kvcache.models.model_config import ModelConfig
from kvcache.models.vision import without_vision_tower
from kvcache.sizing.engine_rules import MultimodalMemory

# configs/model_config.py multimodal_model_archs (MIMO_V2_MULTIMODAL_ARCHS written out)
MULTIMODAL_ARCHITECTURES = frozenset({
    "CLIPModel", "Cohere2VisionForConditionalGeneration", "Cosmos3EdgeForConditionalGeneration",
    "DeepseekVL2ForCausalLM", "Ernie4_5_VLMoeForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
    "Gemma3ForConditionalGeneration", "Gemma3nForConditionalGeneration", "Gemma4ForConditionalGeneration",
    "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration", "DiffusionGemmaForBlockDiffusion",
    "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "Glm5NextForConditionalGeneration",
    "GlmOcrForConditionalGeneration", "GlmAsrForConditionalGeneration", "GlmImageForConditionalGeneration",
    "Grok1VForCausalLM", "Grok1AForCausalLM", "LlavaLlamaForCausalLM", "Llama4ForConditionalGeneration",
    "LlavaMistralForCausalLM", "LlavaQwenForCausalLM", "LlavaForConditionalGeneration", "LlavaVidForCausalLM",
    "Lfm2VlForConditionalGeneration", "LightOnOCRForConditionalGeneration", "MiMoV2ForCausalLM",
    "MiMoV2ASRForCausalLM", "MiniCPMO", "MiniCPMV", "Mistral3ForConditionalGeneration", "MultiModalityCausalLM",
    "MllamaForConditionalGeneration", "MossVLForConditionalGeneration", "NemotronH_Nano_VL_V2",
    "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Omni_Reasoning_V3", "MuseGlimmerForConditionalGeneration",
    "MuseSparkForConditionalGeneration", "PixtralForConditionalGeneration", "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "Qwen3ASRForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration", "KimiVLForConditionalGeneration",
    "LocateAnythingForConditionalGeneration", "InternVLChatModel", "InternS1ForConditionalGeneration",
    "InternS1ProForConditionalGeneration", "Phi4MMForCausalLM", "VoxtralForConditionalGeneration",
    "WhisperForConditionalGeneration", "Step3VLForConditionalGeneration", "POINTSV15ChatModel", "DotsVLMForCausalLM",
    "Dots3NoteForCausalLM", "DotsOCRForCausalLM", "Sarashina2VisionForCausalLM", "NVILAForConditionalGeneration",
    "NVILALiteForConditionalGeneration", "DeepseekOCRForCausalLM", "UnlimitedOCRForCausalLM",
    "JetVLMForConditionalGeneration", "PaddleOCRVLForConditionalGeneration", "MiDashengLMModel",
    "StepVLForConditionalGeneration", "Step3p7ForConditionalGeneration", "KimiK25ForConditionalGeneration",
    "BailingMMNativeForConditionalGeneration", "BailingMM2NativeForConditionalGeneration",
    "BailingMoeV3VLForConditionalGeneration",
})

# ModelConfig.__init__'s mm_disabled_models: multimodal off unless --enable-multimodal (keyed by the first entry)
MULTIMODAL_OFF_BY_DEFAULT = frozenset({
    "Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration", "Step3VLForConditionalGeneration",
    "InklingForConditionalGeneration",
})
# MIMO_V2_MULTIMODAL_ARCHS: multimodal off by default unless the config has both towers' configs
MIMO_V2_MULTIMODAL_ARCHITECTURES = frozenset({"MiMoV2ForCausalLM"})

# multimodal_breakable_cuda_graph_supported_model_archs: multimodal models that keep prefill CUDA graphs
BREAKABLE_PREFILL_GRAPH_ARCHITECTURES = frozenset({
    "MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "KimiK25ForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
})

# models/qwen3_vl.py (Qwen3-VL and its subclasses in qwen3_vl_moe.py, qwen3_5.py, qwen4_exp.py), muse_glimmer.py,
# cosmos3_edge.py: with --language-model-only (or the config's own) no vision tower is built or loaded
NO_TOWER_WHEN_LANGUAGE_MODEL_ONLY = frozenset({
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "MuseGlimmerForConditionalGeneration",
    "Cosmos3EdgeForConditionalGeneration",
})
# models/mllama4.py: the vision model is built only with --enable-multimodal (has_vision)
TOWER_ONLY_WITH_ENABLE_MULTIMODAL = frozenset({"Llama4ForConditionalGeneration"})

# get_hf_text_config's language-model sub-configs: one present makes the config a multimodal wrapper
TEXT_SUBCONFIG_KEYS = ("thinker_config", "llm_config", "language_config", "text_config")

VLM_CACHE_RESERVE_MIB = 100  # SGLANG_VLM_CACHE_SIZE_MB's default
VLM_FRACTION_RATIO = Fraction(95, 100)  # adjust_mem_fraction_for_vlm's base reduction
BASELINE_VIT_LAYERS, BASELINE_VIT_HIDDEN = 24, 1024  # ViT-L/14; also the values read where vision_config lacks them
VIT_SENSITIVITY = Fraction(1, 10)  # each doubling of the ViT's layers x hidden^2 takes 10% more
VIT_FACTOR_BOUNDS = (Fraction(4, 5), Fraction(21, 20))
POST_CAPTURE_VLM_CUT_MIB = 8 * 1024  # with post-capture KV sizing: 8 GiB of the card for the image encoder


def is_multimodal_config(model: ModelConfig) -> bool:
    """A multimodal architecture, a language-model sub-config, or DeepSeek-V4.1's vision layers (whatever the flags)."""
    hf = model.hf_config
    vision_layers = hf.get("vision_n_layers")
    dsv41_vision = hf.get("model_type") == "deepseek_v41" and isinstance(vision_layers, int) and vision_layers > 0
    return (any(a in MULTIMODAL_ARCHITECTURES for a in architectures(model)) or dsv41_vision
            or any(isinstance(hf.get(k), dict) for k in TEXT_SUBCONFIG_KEYS))


def multimodal_side(model: ModelConfig, *, enable_multimodal: bool | None, language_model_only: bool,
                    label: str) -> tuple[bool, str]:
    """(is_multimodal, why) as SGLang 0.5.23's ModelConfig decides it for this config and these flags (`label`
    names the engine in the why)."""
    hf, first = model.hf_config, architectures(model)[0]
    if not is_multimodal_config(model):
        return False, f"{first} is a text model"
    if language_model_only:
        return False, "--language-model-only"
    if hf.get("language_model_only"):
        return False, "config.json's language_model_only"
    if enable_multimodal is None:
        if first in MULTIMODAL_OFF_BY_DEFAULT:
            return False, f"{label} turns {first}'s multimodal side off by default (--enable-multimodal)"
        if first in MIMO_V2_MULTIMODAL_ARCHITECTURES and not ("vision_config" in hf and "audio_config" in hf):
            return False, f"{first} without vision_config and audio_config is text-only in {label}"
        return True, f"{label} serves {first}'s multimodal side by default (--language-model-only turns it off)"
    if not enable_multimodal:
        return False, "enable_multimodal is false"
    return True, "--enable-multimodal"


def vit_factor(model: ModelConfig) -> Fraction | None:
    """adjust_mem_fraction_for_vlm's whole factor, 0.95 x the clamped ViT-size factor (exact), or None when
    config.json has no vision_config (SGLang then leaves the fraction as it is)."""
    vision = ConfigFields(model.hf_config, model.name).section("vision_config")
    if vision is None:
        return None
    layers = vision.int("num_hidden_layers", default=BASELINE_VIT_LAYERS, high=MAX_LAYERS)
    hidden = vision.int("hidden_size", default=BASELINE_VIT_HIDDEN)
    ratio = Fraction(layers * hidden * hidden, BASELINE_VIT_LAYERS * BASELINE_VIT_HIDDEN * BASELINE_VIT_HIDDEN)
    low, high = VIT_FACTOR_BOUNDS
    return VLM_FRACTION_RATIO * min(high, max(low, 1 - VIT_SENSITIVITY * (ratio - 1)))


def sglang_multimodal_memory(model: ModelConfig, *, enable_multimodal: bool | None, language_model_only: bool,
                             label: str) -> MultimodalMemory:
    """SGLang 0.5.23's multimodal memory rule for this model and these flags (see the module docstring)."""
    on, why = multimodal_side(model, enable_multimodal=enable_multimodal, language_model_only=language_model_only,
                              label=label)
    if not on:
        return MultimodalMemory(on=False, why=why, multimodal_model=is_multimodal_config(model))
    return MultimodalMemory(
        on=True, why=why, multimodal_model=True, fraction_factor=vit_factor(model),
        post_capture_cut_mib=POST_CAPTURE_VLM_CUT_MIB, reserve_bytes=VLM_CACHE_RESERVE_MIB * MiB,
        prefill_cuda_graphs=any(a in BREAKABLE_PREFILL_GRAPH_ARCHITECTURES for a in architectures(model)),
    )


def sglang_served_model(model: ModelConfig, *, enable_multimodal: bool | None, language_model_only: bool) -> ModelConfig:
    """The model as SGLang 0.5.23 builds it: without the vision tower where its model class skips it (text-only
    serving of the Qwen3-VL family; Llama-4 without --enable-multimodal); else as read."""
    first = architectures(model)[0]
    text_only = language_model_only or bool(model.hf_config.get("language_model_only"))
    if (first in NO_TOWER_WHEN_LANGUAGE_MODEL_ONLY and text_only) or (
            first in TOWER_ONLY_WITH_ENABLE_MULTIMODAL and not enable_multimodal):
        return without_vision_tower(model)
    return model
