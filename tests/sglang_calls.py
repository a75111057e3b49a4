"""SGLang 0.5.23's paged allocation calls, as its scheduler makes them (device lengths and their CPU copies)."""

from __future__ import annotations

from typing import Any

import torch


def _where(a: Any) -> torch.device:
    return a.device if a.device.type != "meta" else torch.device("cpu")


def extend(a: Any, prefix: torch.Tensor, seq: torch.Tensor, last: torch.Tensor, tokens: int,
           num_new_pages: int | None = None) -> torch.Tensor | None:
    """alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens)."""
    d = _where(a)
    kwargs = {} if num_new_pages is None else {"num_new_pages": num_new_pages}
    return a.alloc_extend(prefix.to(d), prefix.cpu(), seq.to(d), seq.cpu(), last.to(d), tokens, **kwargs)


def decode(a: Any, seq: torch.Tensor, last: torch.Tensor) -> torch.Tensor | None:
    """alloc_decode(seq_lens, seq_lens_cpu, last_loc)."""
    d = _where(a)
    return a.alloc_decode(seq.to(d), seq.cpu(), last.to(d))
