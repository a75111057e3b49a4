"""Which torch device an engine runs on."""

from __future__ import annotations

import torch

from kvcache.errors import ConfigError


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    """'auto' is CUDA when present, else the CPU; 'cuda' without CUDA is an error.
    A CUDA rank takes the GPU of its local rank (one GPU per process, as torchrun starts them)."""
    if requested == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda, but torch sees no CUDA device; use --device cpu or a dry run (plan)")
        return torch.device("cuda", local_rank)
    return torch.device(requested)
