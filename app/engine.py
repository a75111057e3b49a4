"""Engine: the bootstrap order of one engine's workers.

Both workers load weights before the target profiles, so the draft's weights are
inside the measured use; then the target configures (paying for the draft's pools)
and the draft configures from the target's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvcache.models.model_config import ModelConfig

from app.model_runner import ModelRunner


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """A target worker and, with speculative decoding, a draft worker."""

    target: ModelRunner
    draft: ModelRunner | None = None

    def __post_init__(self) -> None:
        if self.draft is not None:  # a fix for the target must hold its draft too (app.worker_refusals)
            draft = self.draft
            self.target.draft_refusals = lambda: draft.refusals(alone=True)

    def bootstrap(self) -> None:
        self.target.parallel_state.agreement.run_everywhere(self._load_weights)  # a stage that cannot load stops all
        self.target.init_memory_pool()
        if self.draft is not None:
            self.draft.init_memory_pool()
        self.target.start_decode_runtime()  # graphs + post-capture resize, when the target's pools are resizable

    def _load_weights(self) -> None:
        self.target.load_weights()
        if self.draft is not None:
            self.draft.load_weights()

    @property
    def workers(self) -> tuple[ModelRunner, ...]:
        return (self.target,) if self.draft is None else (self.target, self.draft)


def draft_runner_for(draft_model_config: ModelConfig | None, make_runner: Callable[[], ModelRunner]) -> ModelRunner | None:
    """The draft worker's runner when there is a draft model; it is not built otherwise."""
    return None if draft_model_config is None else make_runner()
