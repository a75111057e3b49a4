"""RankAgreement: what every rank of one engine must decide alike, in integer bytes.

SGLang 0.5.23 MIN-reduces each rank's free memory as a float32 count of GiB (so bytes
round) and raises "memory capacity is unbalanced" when a rank sees under 90% of what
another sees. Here the numbers are int64 bytes, gathered from every rank so that an
imbalance names each rank's free bytes, and the 90% is `--min-rank-memory-ratio`.

A step that can fail on one rank only (planning a pipeline stage, building its pools)
runs through `run_everywhere`: the ranks exchange success or failure before any of
them goes on, so either all return or all raise the same typed error, and a rank
whose own step succeeded drops what it built.

The exchange itself is the group's (`RankGroup`): torch.distributed's over processes
(kvcache.memory.torch_collectives), or a dry run's stages as threads (kvcache.inputs.in_process_group),
so deciding imports no torch.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Protocol, Sequence, TypeVar

from kvcache.byte_units import format_bytes
from kvcache.errors import KVCacheError, RankFailedError, UnbalancedMemoryError
from kvcache.arithmetic import ceil_div
from kvcache.inputs.sglang_ratios import SGLANG_MIN_RANK_MEMORY_RATIO

T = TypeVar("T")


class RankGroup(Protocol):
    """The collectives the ranks agree through; `rank` is the caller's index in the group."""

    def gather_int64(self, rank: int, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every member's `values`, indexed by member."""
        ...

    def min_int64(self, rank: int, values: tuple[int, ...]) -> tuple[int, ...]:
        """The element-wise smallest `values` over the members."""
        ...

    def gather_objects(self, rank: int, obj: Any) -> list[Any]:
        """Every member's picklable `obj`, indexed by member."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AgreedMemory:
    """The smallest free and total bytes over the ranks, which every rank then plans with."""

    free_before_load: int
    free_after_load: int
    total: int
    free_before_load_by_rank: tuple[int, ...]
    device_capacity: int  # nvidia-smi's total: SGLang reads every GPU's and keeps the smallest


@dataclass(frozen=True, slots=True)
class _Failure:
    """A failed step as it travels to the other ranks: enough to raise the same error there."""

    rank: int
    error_type: type
    message: str
    state: dict[str, Any]
    typed: bool

    def error(self, prefix: str) -> Exception:
        if not self.typed:
            return RankFailedError(f"{prefix}: {self.error_type.__name__}: {self.message}")
        err = self.error_type.__new__(self.error_type)
        err.__dict__.update(self.state)
        if isinstance(self.state.get("what"), str):  # a DoesNotFitError's headline, which the CLI prints
            err.__dict__["what"] = f"{prefix}: {self.state['what']}"
        err.args = (f"{prefix}: {self.message}",)
        return err


def _failure_of(exc: Exception, rank: int) -> _Failure:
    state = dict(vars(exc))
    try:
        pickle.dumps((type(exc), state))
    except Exception:  # an attribute that cannot travel: send the message alone
        state = {}
    return _Failure(rank=rank, error_type=type(exc), message=str(exc), state=state,
                    typed=isinstance(exc, KVCacheError))


@dataclass(frozen=True, slots=True, kw_only=True)
class RankAgreement:
    """Agreement over a group spanning every rank (a CPU gloo group, or a dry run's threads); `group=None` means
    this rank is alone."""

    group: RankGroup | None
    rank: int
    world_size: int
    rank_names: tuple[str, ...]
    min_rank_memory_ratio: float = SGLANG_MIN_RANK_MEMORY_RATIO

    @classmethod
    def alone(cls, name: str = "rank 0") -> "RankAgreement":
        return cls(group=None, rank=0, world_size=1, rank_names=(name,))

    def gather_int64(self, values: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Every rank's `values`, indexed by rank."""
        if self.group is None:
            return (tuple(values),)
        return tuple(self.group.gather_int64(self.rank, tuple(int(v) for v in values)))

    def min_int64(self, values: Sequence[int]) -> tuple[int, ...]:
        """The element-wise smallest `values` over the ranks (an int64 MIN all-reduce)."""
        if self.group is None:
            return tuple(values)
        return self.group.min_int64(self.rank, tuple(int(v) for v in values))

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, indexed by rank."""
        if self.group is None:
            return [obj]
        return self.group.gather_objects(self.rank, obj)

    def agree_on_memory(self, *, free_before_load: int, free_after_load: int, total_bytes: int,
                        device_capacity_bytes: int) -> AgreedMemory:
        """The MIN of each number over the ranks, after checking free memory before load is balanced."""
        by_rank = self.gather_int64((free_before_load, free_after_load, total_bytes, device_capacity_bytes))
        before = tuple(r[0] for r in by_rank)
        check_memory_balance(before, self.min_rank_memory_ratio, self.rank_names)
        return AgreedMemory(free_before_load=min(before), free_after_load=min(r[1] for r in by_rank),
                            total=min(r[2] for r in by_rank), free_before_load_by_rank=before,
                            device_capacity=min(r[3] for r in by_rank))

    def run_everywhere(self, step: Callable[[], T]) -> T:
        """`step()` on this rank, returned only when it succeeded on every rank; otherwise every rank
        raises the lowest failing rank's error (same type, same message) and this rank's result is dropped."""
        if self.group is None:
            return step()
        result: T | None = None
        failure: _Failure | None = None
        bug: Exception | None = None
        try:
            result = step()
        except KVCacheError as exc:
            failure = _failure_of(exc, self.rank)
        except Exception as exc:  # not ours: this rank keeps its traceback, the others learn what it was
            failure, bug = _failure_of(exc, self.rank), exc
        failures = [f for f in self.gather_objects(failure) if f is not None]
        if not failures:
            return result  # type: ignore[return-value]
        result = None  # what this rank built is freed before any rank returns
        if bug is not None:
            raise bug
        first = failures[0]
        others = f" and {len(failures) - 1} other rank(s)" if len(failures) > 1 else ""
        raise first.error(self.rank_names[first.rank] + others)


def check_memory_balance(free_by_rank: Sequence[int], min_ratio: float, rank_names: Sequence[str]) -> None:
    """Raise UnbalancedMemoryError when the smallest free bytes are under `min_ratio` of the largest (0: off)."""
    smallest, largest = min(free_by_rank), max(free_by_rank)
    ratio = Fraction(repr(min_ratio))
    if smallest * ratio.denominator >= largest * ratio.numerator:
        return
    low = free_by_rank.index(smallest)
    percent = smallest * 100 // largest
    per_rank = ", ".join(f"{name} {format_bytes(n)}" for name, n in zip(rank_names, free_by_rank))
    raise UnbalancedMemoryError(
        f"free memory before loading weights is unbalanced across ranks: {per_rank}; the smallest is "
        f"{percent}% of the largest, under --min-rank-memory-ratio {min_ratio} (another process may hold "
        f"memory on {rank_names[low]})",
        needed_bytes=ceil_div(largest * ratio.numerator, ratio.denominator), available_bytes=smallest,
        suggestions=(f"free the memory held on {rank_names[low]}",
                     f"--min-rank-memory-ratio {percent / 100:g} (every rank then plans with the smallest)"),
    )
