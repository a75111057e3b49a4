"""Typed errors. Each carries its numbers and says which knob to change, and to what."""

from __future__ import annotations

from kvcache.byte_units import format_bytes


class KVCacheError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(KVCacheError, ValueError):
    """An input (ServerArgs, a model config, a flag) is malformed or inconsistent."""


class UnsupportedModelError(ConfigError):
    """The model's architecture or one of its fields is not supported."""


class ModelConfigFieldError(UnsupportedModelError):
    """One field of a model's config.json is missing or holds a value no model can have."""


class DoesNotFitError(KVCacheError):
    """The KV cache (or the weights) do not fit the memory there is.

    `needed_bytes` and `available_bytes` are the numbers behind the message;
    `suggestions` are human-readable fixes, each naming a flag and a value that works.
    """

    def __init__(self, what: str, *, needed_bytes: int, available_bytes: int, suggestions: tuple[str, ...] = ()) -> None:
        self.what = what
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.suggestions = suggestions
        super().__init__(self._message())

    def _message(self) -> str:
        lines = [
            self.what,
            f"  needed:    {format_bytes(self.needed_bytes)}",
            f"  available: {format_bytes(self.available_bytes)}",
        ]
        if self.suggestions:
            lines.append("  what would work:")
            lines.extend(f"    - {s}" for s in self.suggestions)
        return "\n".join(lines)

    def with_suggestions(self, suggestions: tuple[str, ...]) -> "DoesNotFitError":
        """The same error of the same class, with fixes worked out by the caller."""
        clone = type(self).__new__(type(self))
        DoesNotFitError.__init__(
            clone, self.what, needed_bytes=self.needed_bytes,
            available_bytes=self.available_bytes, suggestions=suggestions,
        )
        return clone


class WeightsLeaveNoRoomError(DoesNotFitError):
    """After loading weights, the budget for the KV cache is zero or negative."""


class BudgetBelowOnePageError(DoesNotFitError):
    """The budget does not hold one page of KV (plus the fixed buffers)."""


class BudgetBelowOneRequestError(DoesNotFitError):
    """The budget holds fewer tokens than one request of context_length."""


class KVCacheMemoryTooLargeError(DoesNotFitError):
    """`kv_cache_memory` asks for more than is free after loading weights."""


class PoolBuildError(KVCacheError):
    """Building the pools broke one of the builder's invariants (a layout the plan cannot pair): a bug.

    What was built has been freed. The out-of-memory case is its subclass, PoolOutOfMemoryError."""


class PoolOutOfMemoryError(PoolBuildError):
    """The device refused memory part-way through building the planned pools; what was built has been freed."""


class WeightsDoNotFitError(DoesNotFitError):
    """The model's weights alone are larger than the memory free before loading."""


class PlanMismatchError(KVCacheError):
    """What was built differs from the plan (a buffer's bytes, or the arena's): a bug, never a silently wrong number."""


class UnbalancedMemoryError(DoesNotFitError):
    """The ranks of one engine see very different free memory (another process holds some of it)."""


class RankFailedError(KVCacheError):
    """Another rank failed with an error that is not one of ours; this rank stopped with it."""


class VmmError(KVCacheError):
    """A virtual-memory driver call failed (out of memory, or VMM unsupported)."""


class VmmOutOfMemoryError(VmmError):
    """The driver refused physical memory (CUDA_ERROR_OUT_OF_MEMORY): the plan does not fit, no bug."""


class RankLostError(KVCacheError):
    """A collective failed: another rank went away (it failed, or was killed) while the ranks agreed. Every
    surviving rank raises it at once, with the same message, instead of waiting out the collective timeout."""
