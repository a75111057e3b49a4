"""Optional: our parameter counts against transformers' own models built on the meta device.

Skipped unless transformers is installed (it is not a dependency), and per model where that
transformers version does not know the model_type; any other failure to build the model fails the
test. The language model is compared where AutoModelForCausalLM drops a multimodal config's vision
tower, the whole model
where it keeps it.
Differences allowed up to 1e-4: norm biases and extra norms some families add (GLM-4's
post-sublayer norms, OLMo-2's full-width q/k norms, DeepSeek-V3.2's indexer norm bias) that
our layouts approximate; EAGLE-3 is left out (transformers builds a whole Llama from its config).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from kvcache.models.hf_config import model_config_from_hf

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted([*ROOT.glob("kvcache/models/presets/*.json"), *ROOT.glob("tests/model_corpus/*.json")])
SKIP = {"EAGLE3-LLaMA3.1-Instruct-8B", "DeepSeek-V4-Flash", "gemma-4-26B-A4B"}
# Known, explained gaps (either form of the config): Zamba-2's per-layer LoRA adapters on its shared blocks are not modelled;
# SigLIP's patch-conv bias and position table are approximated in Gemma-3's vision tower.
TOLERANCE = {"Zamba2-2.7B": 0.011, "gemma-3-27b-it": 1e-3}


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '5.19.0' or '4.57.1.dev0'."""
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2])
    return major, minor


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem not in SKIP], ids=lambda p: p.stem)
def test_count_parameters_equals_the_transformers_meta_model(path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    raw = transformers.PretrainedConfig._dict_from_json_file(path)  # as from_pretrained reads it (tagged floats)
    if raw["model_type"] not in transformers.CONFIG_MAPPING:  # an older transformers: a precondition, not an error
        pytest.skip(f"transformers {transformers.__version__} does not know model_type {raw['model_type']!r}")
    if path.stem.endswith("-transformers5") and _release(transformers.__version__) < (5, 15):
        pytest.skip(f"transformers {transformers.__version__} predates 5.15's layer names "
                    "(linear_attention / full_attention for Mamba and attention)")
    # auto_map names the checkpoint's own remote code; the comparison is with transformers' in-library class
    config = transformers.AutoConfig.for_model(
        raw["model_type"], **{k: v for k, v in raw.items() if k not in ("model_type", "auto_map")})
    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:  # transformers 5 builds VLMs as image-text only
        pytest.skip(f"transformers {transformers.__version__} builds no causal LM for {type(config).__name__}")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    theirs = sum(p.numel() for p in model.parameters())  # tied tensors count once
    with_vision = any("vision" in name or "visual" in name for name, _ in model.named_parameters())
    specs = model_config_from_hf(path).weights.parameter_specs()
    ours = sum(s.numel for s in specs if with_vision or not s.name.startswith(("vision_tower.", "multi_modal_projector.")))
    assert ours == pytest.approx(theirs, rel=TOLERANCE.get(path.stem.removesuffix("-transformers5"), 1e-4))
