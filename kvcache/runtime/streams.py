"""The forward stream a worker runs on: a CUDA stream on CUDA, a stand-in elsewhere.

`HostStream` has the parts of torch.cuda.Stream's interface an engine calls
(synchronize, wait_stream, query, and use as a context), so the same runner code
works on cpu and meta, where work is synchronous.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class ForwardStream(Protocol):
    """What the engine asks of a stream: enter it to queue work on it, and wait for that work."""

    def synchronize(self) -> None: ...

    def wait_stream(self, stream: Any) -> None: ...

    def query(self) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...


class HostStream:
    """A stream on a device without streams: every method returns at once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        """Host work is already done when it returns."""

    def wait_stream(self, stream: Any) -> None:
        """Nothing runs out of order on the host."""

    def query(self) -> bool:
        return True

    def __enter__(self) -> "HostStream":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None


def forward_stream_for(device: torch.device) -> ForwardStream:
    """torch.cuda.Stream on CUDA; a HostStream on cpu and meta."""
    if device.type == "cuda":
        return torch.cuda.Stream(device=device)
    return HostStream(device)
