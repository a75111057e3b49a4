"""The ranks' agreement over torch.distributed: int64 gathers, a MIN all-reduce and an object exchange on one CPU
(gloo) group spanning every rank, which kvcache.inputs.rank_agreement.RankAgreement decides through."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from kvcache.errors import RankLostError


@dataclass(frozen=True, slots=True)
class TorchRankGroup:
    """A torch.distributed process group (made by app.parallel_setup) as a RankGroup."""

    group: Any
    world_size: int

    def gather_int64(self, rank: int, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every rank's `values`, indexed by rank."""
        local = torch.tensor(list(values), dtype=torch.int64)
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        self._collective(lambda: dist.all_gather(out, local, group=self.group))
        return [tuple(int(x) for x in t.tolist()) for t in out]

    def min_int64(self, rank: int, values: tuple[int, ...]) -> tuple[int, ...]:
        """The element-wise smallest `values` over the ranks (an int64 MIN all-reduce)."""
        t = torch.tensor(list(values), dtype=torch.int64)
        self._collective(lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group))
        return tuple(int(x) for x in t.tolist())

    def gather_objects(self, rank: int, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`. Our own byte exchange: torch's all_gather_object needs NumPy, which this
        engine does not install."""
        payload = pickle.dumps(obj)
        lengths = [n for (n,) in self.gather_int64(rank, (len(payload),))]
        local = torch.zeros(max(lengths), dtype=torch.uint8)
        if payload:
            local[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        self._collective(lambda: dist.all_gather(out, local, group=self.group))
        return [pickle.loads(bytes(t[:n].tolist())) for t, n in zip(out, lengths)]

    def _collective(self, call: Callable[[], Any]) -> None:
        """One collective; a peer that went away (gloo: 'Connection closed by peer', raised as soon as the peer's
        sockets close, which its death or its own failed start does) is RankLostError, the same on every rank."""
        try:
            call()
        except RuntimeError as exc:  # gloo's and NCCL's DistBackendError are RuntimeErrors
            raise RankLostError(
                f"the ranks stopped agreeing: another rank failed or was killed during start-up ({self.world_size} "
                "ranks; the failing rank's own output says why); nothing is left allocated here") from exc
