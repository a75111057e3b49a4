"""ParallelState: this rank's place in tensor, pipeline and attention-data parallelism.

Ranks are laid out as SGLang 0.5.23 lays them out: tensor parallelism innermost,
`rank = pp_rank * tp_size + tp_rank`. Within a pipeline stage, attention data
parallelism splits the TP ranks into `attention_dp_size` groups of
`attention_tp_size` ranks that share one attention layer's heads.

A ParallelState with `groups=None` is one process planning one rank of a layout
alone (a dry run, or a single-process engine); with `groups`, it belongs to a real
torch.distributed process group and its ranks agree through `agreement`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.errors import ConfigError
from kvcache.inputs.pipeline_stages import stage_layers
from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.inputs.sglang_ratios import SGLANG_MIN_RANK_MEMORY_RATIO


@dataclass(frozen=True, slots=True)
class ProcessGroups:
    """The torch.distributed groups this rank belongs to (handles made by app.parallel_setup).

    `agreement` is a RankGroup (kvcache.inputs.rank_agreement) over every rank, a CPU (gloo) group's
    (kvcache.memory.torch_collectives): sizing decisions are a few int64s, so they never touch the
    accelerator's communicator.
    """

    agreement: Any
    tp: Any
    pp: Any
    attention_tp: Any
    attention_dp: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelState:
    """Sizes and ranks of each parallel group, and what they imply for this rank."""

    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    pp_layer_partition: tuple[int, ...] | None = None  # --pp-layer-partition: layers a stage, given by hand
    attention_dp_size: int = 1
    local_rank: int = 0  # the accelerator index on this host
    min_rank_memory_ratio: float = SGLANG_MIN_RANK_MEMORY_RATIO  # --min-rank-memory-ratio: how unbalanced the ranks' free memory may be
    groups: ProcessGroups | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size or not 0 <= self.pp_rank < self.pp_size:
            raise ConfigError(f"rank out of range: tp {self.tp_rank}/{self.tp_size}, pp {self.pp_rank}/{self.pp_size}")
        if self.tp_size % self.attention_dp_size:
            raise ConfigError(f"tp_size {self.tp_size} is not a multiple of attention_dp_size {self.attention_dp_size}")

    # ---- where this rank sits ------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks in the layout (tp x pp); a single process plans one of them."""
        return self.tp_size * self.pp_size

    @property
    def rank(self) -> int:
        """This rank's global index: TP innermost."""
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def attention_tp_size(self) -> int:
        """Ranks that split one attention layer's heads."""
        return self.tp_size // self.attention_dp_size

    @property
    def attention_tp_rank(self) -> int:
        return self.tp_rank % self.attention_tp_size

    @property
    def attention_dp_rank(self) -> int:
        return self.tp_rank // self.attention_tp_size

    @property
    def is_distributed(self) -> bool:
        """True when other processes hold the other ranks."""
        return self.groups is not None

    @property
    def agreement(self) -> RankAgreement:
        """How this rank agrees with the others (trivially with itself when alone)."""
        if self.groups is None:
            return RankAgreement.alone(self.describe())
        group = self.groups.agreement
        if getattr(group, "one_rank_per_stage", False):  # a dry run's stages as threads (kvcache.inputs.in_process_group)
            return RankAgreement(group=group, rank=self.pp_rank, world_size=self.pp_size,
                                 rank_names=tuple(self.describe(s * self.tp_size) for s in range(self.pp_size)),
                                 min_rank_memory_ratio=self.min_rank_memory_ratio)
        return RankAgreement(group=group, rank=self.rank, world_size=self.world_size,
                             rank_names=tuple(self.describe(r) for r in range(self.world_size)),
                             min_rank_memory_ratio=self.min_rank_memory_ratio)

    def describe(self, rank: int | None = None) -> str:
        """'rank 1 (tp 1/2, pp 0/1)': how errors and reports name a rank."""
        r = self.rank if rank is None else rank
        return f"rank {r} (tp {r % self.tp_size}/{self.tp_size}, pp {r // self.tp_size}/{self.pp_size})"

    # ---- what this rank holds ------------------------------------------------
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
        """This pipeline rank's layers, as SGLang 0.5.23 splits them (kvcache.inputs.pipeline_stages)."""
        return stage_layers(num_layers, self.pp_size, self.pp_rank, self.pp_layer_partition)

    @property
    def is_first_pp_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def min_across_ranks(self, value: int) -> int:
        """The smallest `value` over all ranks (an int64 MIN all-reduce when other ranks exist)."""
        return self.agreement.min_int64((value,))[0]


def group_ranks(*, tp_size: int, pp_size: int, attention_dp_size: int = 1) -> dict[str, list[list[int]]]:
    """Every group of each kind, as lists of global ranks (the order torch's new_group must see on every rank)."""
    stages = [list(range(s * tp_size, (s + 1) * tp_size)) for s in range(pp_size)]
    attn_tp = tp_size // attention_dp_size
    return {
        "tp": stages,
        "pp": [list(range(t, tp_size * pp_size, tp_size)) for t in range(tp_size)],
        "attention_tp": [stage[d * attn_tp:(d + 1) * attn_tp] for stage in stages for d in range(attention_dp_size)],
        "attention_dp": [stage[t::attn_tp] for stage in stages for t in range(attn_tp)],
    }
