"""The KV page size, where the model decides it: DeepSeek sparse attention (DSA) is paged at 64.

SGLang 0.5.23 (`arg_groups/model_overrides/deepseek_v2.py`, the DeepSeek-family override for
a config with `index_topk`: DeepSeek-V3.2, GLM-5) sets page_size to 64 x index_kpool on CUDA
and on every other platform but ROCm's legacy path (1), XPU (128) and NPU. It does so whatever
--page-size says, logging a warning: an explicit other value is overridden, not refused. This
engine does the same, and the report says so. Every other model pages at --page-size, default 1; the
one resolution of the two is kvcache.inputs.sizing_settings.resolved_page_size.

Not modelled: index_kpool > 1 (pooled indexer keys); the shipped and corpus DSA configs have none.
"""

from __future__ import annotations

from kvcache.models.model_config import ModelConfig

SGLANG_DSA_PAGE_SIZE = 64


def forced_page_size(model: ModelConfig) -> int | None:
    """The page size SGLang 0.5.23 uses for this model whatever --page-size says, or None."""
    return SGLANG_DSA_PAGE_SIZE if model.index_head_dim is not None else None


def note_on_page_size(requested: int | None, model: ModelConfig) -> str | None:
    """One line for the report when the model set the page size, naming an overridden --page-size."""
    forced = forced_page_size(model)
    if forced is None:
        return None
    overridden = f"; --page-size {requested} overridden" if requested not in (None, forced) else ""
    return f"DeepSeek sparse attention: SGLang 0.5.23 always pages it at {forced}{overridden}"
