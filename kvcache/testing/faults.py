"""Fault injection for start-up: fail (or kill the process at) the n-th hit of one named fault point.

The points are the calls every bootstrap already makes, each one of the steps that can fail on a device or
between ranks: `arena` (one allocation that holds a worker's weights or its KV pools: weights first, then the
KV arena), `buffer` (each slot of a pool or allocator carved from an arena: the KV arena, or one of their own), `collective` (each
all_gather / all_reduce the ranks agree through); `graph_capture` and `resize` (CUDA only) are the engine's,
hooked by the caller (kvcache imports nothing of app). An allocation
fails as the device fails it (torch.OutOfMemoryError); a collective as a peer that went away fails it (a
RuntimeError, as gloo and NCCL raise). Strict: an unknown point or count is refused, and `hits` counts every
call seen, so a walk can first count a clean start and then arm each hit in turn.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from kvcache.memory import device_buffers

FaultPoint = Literal["arena", "buffer", "collective", "graph_capture", "resize"]
FAULT_POINTS: tuple[FaultPoint, ...] = ("arena", "buffer", "collective", "graph_capture", "resize")
Action = Literal["raise", "kill"]


class InjectedCollectiveFailure(RuntimeError):
    """What a collective raises when a peer is gone (gloo: 'Connection closed by peer'), injected."""


@dataclass(slots=True)
class FaultInjector:
    """`with FaultInjector(point="arena", at=2).installed():` fails the second arena; `at=None` only counts."""

    point: FaultPoint | None = None
    at: int | None = None
    action: Action = "raise"
    hits: Counter[str] = field(default_factory=Counter)
    fired: bool = False

    def __post_init__(self) -> None:
        if (self.point is None) != (self.at is None):
            raise ValueError("give both point and at (or neither, to count)")
        if self.point is not None and self.point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {self.point!r}; one of {', '.join(FAULT_POINTS)}")
        if self.at is not None and self.at < 1:
            raise ValueError(f"at={self.at}: hits are counted from 1")
        if self.action not in ("raise", "kill"):
            raise ValueError(f"unknown action {self.action!r}; 'raise' or 'kill'")

    def hit(self, point: FaultPoint) -> None:
        """Count one call at `point`; fail it when it is the armed one."""
        self.hits[point] += 1
        if point != self.point or self.hits[point] != self.at or self.fired:
            return
        self.fired = True
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        where = f"{point} #{self.at} (injected)"
        if point == "collective":
            raise InjectedCollectiveFailure(f"connection closed by peer at {where}")
        raise torch.OutOfMemoryError(f"out of memory at {where}")

    @contextlib.contextmanager
    def installed(self, *more: tuple[Any, str, FaultPoint]) -> Iterator["FaultInjector"]:
        """Inside, every fault point reports to this injector; outside, the real calls are back. `more` adds
        (owner, attribute, point) hooks of the layers above kvcache: the engine's graph capture and resize."""
        hooks: list[tuple[Any, str, FaultPoint]] = [
            (device_buffers.Arena, "__init__", "arena"),
            (device_buffers.Arena, "carve_slot", "buffer"),
            (dist, "all_gather", "collective"),
            (dist, "all_reduce", "collective"),
            *more,
        ]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in hooks]
        try:
            for (owner, name, point), (_, _, real) in zip(hooks, saved):
                setattr(owner, name, self._wrap(point, real))
            yield self
        finally:
            for owner, name, real in reversed(saved):
                setattr(owner, name, real)

    def _wrap(self, point: FaultPoint, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.hit(point)
            return real(*args, **kwargs)

        return call
