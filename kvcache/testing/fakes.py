"""The fakes themselves. Each is a real, small implementation of the interface it stands for."""

from __future__ import annotations

from typing import Any

import torch

from kvcache.allocators.factory import allocator_for_plan
from kvcache.byte_units import GiB
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.runtime.streams import HostStream
from kvcache.models.hf_config import model_config_from_hf

# A two-layer Llama-shaped model: 2 KV heads of 16, so 2 * 2 * (16 + 16) * 2 = 256 bytes/token in bf16.
TINY_MODEL_HF_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tiny_model_config(**overrides: Any) -> ModelConfig:
    """The tiny model, with any HF fields changed."""
    return model_config_from_hf({**TINY_MODEL_HF_CONFIG, **overrides}, name="tiny-llama")


def fixed_card_probe(total_gib: int = 1, free_gib: int | None = None) -> FixedMemoryProbe:
    """A simulated card of whole GiB."""
    return FixedMemoryProbe(total_bytes=total_gib * GiB, free_bytes=None if free_gib is None else free_gib * GiB)


class RecordingAllocator:
    """Wraps a real allocator and records every call (name, first argument), nothing more.

    `RecordingAllocator.from_plan` is an AllocatorFactory: override a worker container's
    `allocator_factory` with `providers.Callable(RecordingAllocator.from_plan)` to record
    what an engine's scheduler does.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[str, Any]] = []

    @classmethod
    def from_plan(cls, *, plan: MemoryPoolConfig, device: torch.device, kvcache: Any = None,
                  views: Any = None, check_frees: bool = False) -> "RecordingAllocator":
        """The allocator the plan calls for (kvcache.allocators.factory) on the builder's views, wrapped."""
        return cls(allocator_for_plan(plan=plan, device=device, kvcache=kvcache, views=views, check_frees=check_frees))

    def _record(self, name: str, arg: Any = None) -> None:
        self.calls.append((name, arg))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        self._record("alloc", need_size)
        return self._inner.alloc(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        self._record("free", int(free_index.numel()))
        self._inner.free(free_index)

    def free_group_begin(self) -> None:
        self._record("free_group_begin")
        self._inner.free_group_begin()

    def free_group_end(self) -> None:
        self._record("free_group_end")
        self._inner.free_group_end()

    def available_size(self) -> int:
        self._record("available_size")
        return self._inner.available_size()

    def clear(self) -> None:
        self._record("clear")
        self._inner.clear()

    def backup_state(self) -> Any:
        self._record("backup_state")
        return self._inner.backup_state()

    def restore_state(self, state: Any) -> None:
        self._record("restore_state")
        self._inner.restore_state(state)

    @property
    def size(self) -> int:
        return self._inner.size

    @property
    def page_size(self) -> int:
        return self._inner.page_size

    @property
    def device(self) -> torch.device:
        return self._inner.device

    @property
    def nbytes(self) -> int:
        return self._inner.nbytes

    @property
    def check_frees(self) -> bool:
        return self._inner.check_frees

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return self._inner.named_tensors()

    def get_kvcache(self) -> Any:
        return self._inner.get_kvcache()

    def attach_kvcache(self, kvcache: Any) -> None:
        self._inner.attach_kvcache(kvcache)

    @property
    def full_to_swa_index_mapping(self) -> torch.Tensor:
        """The SWA allocator's map (AttributeError for allocators without a window pool)."""
        return self._inner.full_to_swa_index_mapping


class FailingAllocatorFactory:
    """An AllocatorFactory that raises the error it was given, as a build that fails at that step would.

    Override a worker container's `allocator_factory` with `providers.Callable(FailingAllocatorFactory(err))`.
    """

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self, *, plan: MemoryPoolConfig, device: torch.device, kvcache: Any = None, views: Any = None,
                 check_frees: bool = False) -> Any:
        raise self.error


class RecordingStream(HostStream):
    """A host stream that counts how often work was queued on it and waited for."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.entered = 0
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1

    def __enter__(self) -> "RecordingStream":
        self.entered += 1
        return self


class FixedActivationStep:
    """A WorstCaseStep (kvcache.runtime.measured_headroom) whose steps each allocate a known number of bytes on a
    device and free them: the measured headroom then has a peak known in advance.

    Override a worker container's `worst_case_step` with `providers.Callable(FixedActivationStep.factory({...}))`;
    the factory records the arguments the engine built the step with (`built_with`)."""

    def __init__(self, *, step_bytes: dict[str, int], device: torch.device) -> None:
        if not step_bytes or min(step_bytes.values()) < 0:
            raise ValueError(f"a fixed step allocates zero or more bytes per named step, not {step_bytes}")
        self.step_bytes = dict(step_bytes)
        self.device = device
        self.runs: list[str] = []
        self.built_with: dict[str, Any] = {}

    @classmethod
    def factory(cls, step_bytes: dict[str, int]) -> Any:
        """A callable taking what the engine passes (runner=, chunked_prefill_size=, decode_batch=,
        largest_graph_batch=, mixed_chunk=); its `.last` is the step it built."""
        def build(*, runner: Any, chunked_prefill_size: int, decode_batch: int, largest_graph_batch: int,
                  mixed_chunk: bool) -> "FixedActivationStep":
            step = cls(step_bytes=step_bytes, device=runner.device)
            step.built_with = dict(chunked_prefill_size=chunked_prefill_size, decode_batch=decode_batch,
                                   largest_graph_batch=largest_graph_batch, mixed_chunk=mixed_chunk)
            build.last = step  # type: ignore[attr-defined]
            return step
        return build

    def names(self) -> tuple[str, ...]:
        return tuple(self.step_bytes)

    def run(self, name: str) -> None:
        if name not in self.step_bytes:
            raise ValueError(f"no step {name!r}; steps: {', '.join(self.step_bytes)}")
        held = torch.ones(self.step_bytes[name], dtype=torch.uint8, device=self.device)  # touched: really taken
        self.runs.append(name)
        del held
