"""`fit --engine vllm`: the sweep's cells answered by vLLM 0.34.0's rules (its blocks on each card), not SGLang's pools.

A cell is (card, --tp-size, --pp-size, --kv-cache-dtype) as for SGLang's rules; its answer is `plan --engine vllm`'s
(app.vllm_report.answer_on_card): vLLM's KV budget on the card (its runtime estimated), its blocks and the requests
of --max-model-len tokens they hold at once, at most --max-num-seqs. One wiring (and one weight count) serves every
card of a (TP, PP, KV dtype, length) combination.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.fit_sweep import FitRow, FitSweep, gib, refused
from app.plan_wiring import planned_workers, single_process_state
from app.vllm_report import VllmCase, answer_on_card, vllm_case
from kvcache.errors import BudgetBelowOneRequestError, ConfigError
from kvcache.inputs.cards import SimulatedCard


@dataclass(frozen=True, slots=True)
class _VllmWiring:
    """A combination's case for vLLM's answer and the target's weight bytes on one rank."""

    case: VllmCase
    weights_bytes: int


@dataclass(slots=True)
class VllmFitSweep(FitSweep):
    """A FitSweep whose cells are vLLM 0.34.0's answer (`settings` hold engine = "vllm" and vLLM's flags)."""

    _wirings: dict[tuple[int, int, str, int | None], _VllmWiring | ConfigError] = field(default_factory=dict)

    def combination(self, tp: int, pp: int, dtype: str,  # type: ignore[override]
                    context: int | None) -> _VllmWiring | ConfigError:
        """The wiring for these values, or why vLLM cannot lay the model out so (cached across cards)."""
        key = (tp, pp, dtype, context)
        if key not in self._wirings:
            server_args = self.cell_server_args(tp, pp, dtype, context)
            try:
                workers = planned_workers(server_args, self.model, single_process_state(server_args))
                self._wirings[key] = _VllmWiring(vllm_case(server_args, self.model, workers.sizing), workers.weights[0])
            except ConfigError as exc:
                self._wirings[key] = exc
        return self._wirings[key]

    def running_cap(self, rows: list[FitRow]) -> tuple[str, int | None]:
        """vLLM's max_num_seqs: the one given, else the smallest of the cards' defaults (1024 or 256)."""
        defaults = [r.max_running_requests for r in rows if r.max_running_requests is not None]
        return "max_num_seqs", self.settings.get("max_num_seqs") or min(defaults, default=None)

    def cell(self, card: SimulatedCard, tp: int, pp: int, dtype: str, context: int | None = None) -> FitRow:
        """One cell: vLLM's answer on `card`, and whether its requests of max_model_len meet the target."""
        context = self.target.context_length if context is None else context
        wiring = self.combination(tp, pp, dtype, context)
        row = self.row_start(card, tp, pp, dtype, context)
        if isinstance(wiring, ConfigError):
            return refused(row, "invalid", str(wiring).splitlines()[0])
        row.update(kv_cache_dtype_resolved=wiring.case.kv_dtype.name, weights_bytes=wiring.weights_bytes)
        try:
            answer = answer_on_card(wiring.case, total_bytes=card.total_bytes, weights_bytes=wiring.weights_bytes,
                                    card=card.name)
        except BudgetBelowOneRequestError as exc:
            if exc.available_bytes <= 0:  # the weights and vLLM's start-up leave no KV memory at all
                return refused(row, "weights", f"weights {gib(wiring.weights_bytes)} per GPU leave vLLM no KV memory",
                               needed_bytes=exc.needed_bytes, available_bytes=exc.available_bytes)
            return refused(row, "one_request", str(exc).splitlines()[0], budget_bytes=exc.available_bytes,
                           needed_bytes=exc.needed_bytes, available_bytes=exc.available_bytes)
        except ConfigError as exc:
            return refused(row, "invalid", str(exc).splitlines()[0])
        usable = answer.num_gpu_blocks - 1  # vLLM keeps the null block back
        held = min(usable // answer.blocks_per_request, answer.max_num_seqs)
        headroom, why = self.against_target(held=held, tokens=answer.kv_cache_tokens, context=answer.max_model_len,
                                            running_cap=answer.max_num_seqs, cap_flag="--max-num-seqs")
        return FitRow(**row, fits=not why, outcome="target" if why else "fits", why_not=why, needed_bytes=None,
                      available_bytes=None, budget_bytes=answer.available_bytes, max_total_tokens=answer.kv_cache_tokens,
                      static_plan_tokens=None, tokens_source="vllm_answer", max_running_requests=answer.max_num_seqs,
                      requests_at_context=held, headroom=headroom)
