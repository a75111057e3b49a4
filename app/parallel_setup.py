"""ParallelState as a container Resource: set up on first use, torn down at shutdown.

Single-process for now: rank 0 of every group. When a launcher has initialised
torch.distributed, ranks come from it; this resource never initialises or destroys
a process group it did not create.
"""

from __future__ import annotations

from typing import Iterator

import torch

from kvcache.parallel import ParallelState
from kvcache.server_args import ServerArgs


def parallel_state_resource(server_args: ServerArgs) -> Iterator[ParallelState]:
    rank = 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
    tp_rank = rank % server_args.tp_size
    pp_rank = (rank // server_args.tp_size) % server_args.pp_size
    yield ParallelState(
        tp_size=server_args.tp_size, tp_rank=tp_rank, pp_size=server_args.pp_size, pp_rank=pp_rank,
        attention_dp_size=server_args.attention_dp_size,
    )
