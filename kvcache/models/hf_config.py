"""Reading a Hugging Face config.json (a file, its directory, or the parsed dict) into a ModelConfig.

The one entry point above the family registry: `kvcache.models.model_config` defines the type and
imports no reader, the readers build it, and this module picks the reader (kvcache.models.registry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from kvcache.errors import ConfigError
from kvcache.inputs.input_files import parse_json_object, read_input_text
from kvcache.models.model_config import ModelConfig
from kvcache.models.quantization import refuse_sidecar_quantization
from kvcache.models.registry import read_model


def model_config_from_hf(source: str | Path | Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
    """Read a HF config.json (a path to the file or its directory, or the parsed dict)."""
    if isinstance(source, Mapping):
        hf = dict(source)
        label = name or str(hf.get("_name_or_path") or _first_architecture(hf))
    else:
        hf = read_hf_config_file(source)
        label = name or _label_for_path(Path(source))
    return read_model(hf, name=label)


def read_hf_config_file(path: str | Path) -> dict[str, Any]:
    """Parse config.json (given the file or its directory): bounded, UTF-8, one JSON object (input_files).
    Python's json reads `Infinity`, which some real configs hold (Nemotron-H), where strict decoders refuse it."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = read_input_text(p, what="model config")
    except FileNotFoundError:
        raise ConfigError(f"no model config at {p}: pass a preset name, a model directory or a config.json") from None
    data = parse_json_object(text, p, what="model config")
    refuse_sidecar_quantization(p.parent, data)
    return data


def _first_architecture(hf: Mapping[str, Any]) -> str:
    archs = hf.get("architectures") or [hf.get("model_type", "model")]
    return str(archs[0])


def _label_for_path(p: Path) -> str:
    if p.is_dir():
        return p.name
    return p.parent.name if p.name == "config.json" else p.stem
