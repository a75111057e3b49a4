"""Shipped model presets: real HF config.json files under kvcache/models/presets/ (see SOURCES.md there)."""

from __future__ import annotations

from pathlib import Path

from kvcache.errors import ConfigError
from kvcache.models.model_config import ModelConfig
from kvcache.models.hf_config import model_config_from_hf

PRESET_DIR = Path(__file__).with_name("presets")
DEFAULT_PRESET = "SmolLM2-135M"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_model_config(model: str) -> ModelConfig:
    """A preset name, a model directory, or a path to a config.json."""
    if not model.strip():
        raise ConfigError(f"--model is empty: give a preset ({', '.join(preset_names())}), a model directory or a config.json")
    preset, path = PRESET_DIR / f"{model}.json", Path(model)
    try:
        if preset.is_file():
            return model_config_from_hf(preset, name=model)
        if path.exists():  # a FIFO or a device too: the reader refuses those by name, without reading them
            return model_config_from_hf(path)
    except (OSError, ValueError) as exc:  # a name too long for a path, a NUL byte, an unreadable file
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"cannot read model {model[:80]!r}{'...' if len(model) > 80 else ''}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    raise ConfigError(f"unknown model {model!r}: {_what_to_pass_instead(model)}")


def _what_to_pass_instead(model: str) -> str:
    """The rest of the unknown-model line: for a Hugging Face repo id ('org/NAME') or another spelling of a
    preset's name, that preset (same name, any case); else every preset. Nothing is ever downloaded."""
    names = preset_names()
    guess = {n.lower(): n for n in names}.get(model.rstrip("/").rsplit("/", 1)[-1].lower())
    if "/" in model and not model.startswith(("/", ".", "~")) and not Path(model).parent.exists():
        where = ("it looks like a Hugging Face repo id, and nothing is downloaded here: "
                 "pass a downloaded config.json or its directory")
    elif "/" in model or model.endswith(".json"):
        where = "no such file or directory"
    else:
        where = "not a preset and not a path"
    if guess is not None:
        return f"{where}; the shipped preset {guess!r} has that name: --model {guess}"
    return f"{where}. Presets: {', '.join(names)}"
