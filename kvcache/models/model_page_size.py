"""The KV page size, where the model decides it: DeepSeek sparse attention (DSA) is paged at 64.

SGLang 0.5.23 (`arg_groups/model_overrides/deepseek_v2.py`, the DeepSeek-family override for
a config with `index_topk`: DeepSeek-V3.2, GLM-5) sets page_size to 64 x index_kpool on CUDA
and on every other platform but ROCm's legacy path (1), XPU (128) and NPU. It does so whatever
--page-size says, logging a warning: an explicit other value is overridden, not refused. This
engine does the same, and the report says so. Every other model pages at --page-size, default 1.

Not modelled: index_kpool > 1 (pooled indexer keys); the shipped and corpus DSA configs have none.
"""

from __future__ import annotations

from kvcache.models.model_config import ModelConfig
from kvcache.inputs.server_args import ServerArgs

DEFAULT_PAGE_SIZE = 1  # SGLang 0.5.23's page_size when neither the flag nor the model sets one
SGLANG_DSA_PAGE_SIZE = 64


def forced_page_size(model: ModelConfig) -> int | None:
    """The page size SGLang 0.5.23 uses for this model whatever --page-size says, or None."""
    return SGLANG_DSA_PAGE_SIZE if model.index_head_dim is not None else None


def flag_page_size(requested: int | None) -> int:
    """--page-size, or 1 when it was not given."""
    return DEFAULT_PAGE_SIZE if requested is None else requested


def resolved_page_size(requested: int | None, model: ModelConfig) -> int:
    """The page size an engine for this model runs at: the model's, else the flag's, else 1."""
    forced = forced_page_size(model)
    return flag_page_size(requested) if forced is None else forced


def with_model_page_size(args: ServerArgs, model: ModelConfig) -> ServerArgs:
    """ServerArgs with page_size resolved for this model (the target's: a draft shares its pages)."""
    page = resolved_page_size(args.page_size, model)
    return args if args.page_size == page else args.replace(page_size=page)


def note_on_page_size(requested: int | None, model: ModelConfig) -> str | None:
    """One line for the report when the model set the page size, naming an overridden --page-size."""
    forced = forced_page_size(model)
    if forced is None:
        return None
    overridden = f"; --page-size {requested} overridden" if requested not in (None, forced) else ""
    return f"DeepSeek sparse attention: SGLang 0.5.23 always pages it at {forced}{overridden}"
