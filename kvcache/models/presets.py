"""Shipped model presets: real HF config.json files under kvcache/models/presets/ (see SOURCES.md there)."""

from __future__ import annotations

from pathlib import Path

from kvcache.errors import ConfigError
from kvcache.models.model_config import ModelConfig

PRESET_DIR = Path(__file__).with_name("presets")
DEFAULT_PRESET = "SmolLM2-135M"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_model_config(model: str) -> ModelConfig:
    """A preset name, a model directory, or a path to a config.json."""
    preset = PRESET_DIR / f"{model}.json"
    if preset.is_file():
        return ModelConfig.from_hf_config(preset, name=model)
    path = Path(model)
    if path.is_dir() or path.is_file():
        return ModelConfig.from_hf_config(path)
    raise ConfigError(
        f"unknown model {model!r}: not a preset and not a path. Presets: {', '.join(preset_names())}"
    )
