"""Which config.json architectures each engine version has a model class for (data: model_classes/*.txt).

SGLang 0.5.23 resolves `architectures` against its ModelRegistry; an architecture with no class there is
loaded through its Transformers backend only when transformers (or the config's auto_map) provides the class,
and refused at start-up otherwise (sglang/srt/model_loader/utils.py, get_model_architecture and
resolve_transformers_arch). vLLM 0.34.0 does the same with its registry. A plan for such a config still
follows the layers config.json describes; the report says, in one note, that the engine has no class for it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Mapping

MODEL_CLASSES = Path(__file__).with_name("model_classes")


@cache
def model_classes(engine: str, version: str) -> frozenset[str]:
    """The architectures `engine` `version` has a model class for (one a line in its file, `#` lines comments)."""
    lines = (MODEL_CLASSES / f"{engine}-{version}.txt").read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def no_model_class_note(hf_config: Mapping[str, Any], *, engine: str, version: str, label: str) -> str | None:
    """One line where none of the config's architectures has a model class in this engine version; else None."""
    archs = [str(a) for a in hf_config.get("architectures") or []]
    if not archs or any(a in model_classes(engine, version) for a in archs):
        return None
    custom = " (this config's auto_map names custom code)" if hf_config.get("auto_map") else ""
    return (f"{label} has no model class for {', '.join(archs)}: it loads such a model only through its Transformers "
            f"backend, where transformers or the config's auto_map provides the class{custom}, and refuses it at "
            "start-up otherwise; this plan follows the layers config.json describes")
