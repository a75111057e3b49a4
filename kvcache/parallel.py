"""ParallelState: this rank's place in tensor, pipeline and attention-data parallelism.

Single-process today (rank 0 of each group); `min_across_ranks` is the seam for
multi-process runs: every rank must agree on the smallest token count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelState:
    """Sizes and ranks of each parallel group, and what they imply for this rank."""

    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    attention_dp_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size or not 0 <= self.pp_rank < self.pp_size:
            raise ConfigError(f"rank out of range: tp {self.tp_rank}/{self.tp_size}, pp {self.pp_rank}/{self.pp_size}")
        if self.tp_size % self.attention_dp_size:
            raise ConfigError(f"tp_size {self.tp_size} is not a multiple of attention_dp_size {self.attention_dp_size}")

    @property
    def attention_tp_size(self) -> int:
        """Ranks that split one attention layer's heads."""
        return self.tp_size // self.attention_dp_size

    def heads_per_rank(self, num_heads: int) -> int:
        """KV heads this rank caches: split over attention TP, replicated when there are fewer heads than ranks."""
        return max(1, num_heads // self.attention_tp_size)

    def split_per_rank(self, count: int, what: str) -> int:
        """An evenly sharded count (linear-attention and Mamba heads, groups); it must divide."""
        if count % self.attention_tp_size:
            raise ConfigError(
                f"{what} = {count} does not split over --tp-size {self.attention_tp_size}; "
                f"use a tp size that divides {count}"
            )
        return count // self.attention_tp_size

    def layer_range(self, num_layers: int) -> range:
        """This pipeline rank's layers: contiguous, as even as possible, earlier ranks take the remainder."""
        if num_layers < self.pp_size:
            raise ConfigError(f"{num_layers} layers cannot be split over --pp-size {self.pp_size}; use at most {num_layers}")
        base, extra = divmod(num_layers, self.pp_size)
        start = self.pp_rank * base + min(self.pp_rank, extra)
        return range(start, start + base + (1 if self.pp_rank < extra else 0))

    @property
    def is_first_pp_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def min_across_ranks(self, value: int) -> int:
        """The smallest `value` over all ranks (an all-reduce when torch.distributed runs)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return value
        t = torch.tensor([value], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return int(t.item())
