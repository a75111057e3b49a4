"""`plan --gpu CARD`: the engine's start-up on a card you do not have, planned and not built (app.dry_run).

One process plans rank 0 of the layout, or with --pp-size every pipeline stage in a thread of its own
(app.stage_plans); ranks torchrun started each plan their own rank and rank 0 prints (app.rank_report). Under
--engine vllm the answer is vLLM's block plan (app.vllm_report). Torch is imported only for torchrun's ranks,
whose process group it runs.
"""

from __future__ import annotations

import contextlib
import os

from app.dry_run import dry_run
from app.launcher_env import launched_world_size
from app.plan_wiring import single_process_state
from app.rank_report import render_for_this_rank
from app.report import build_report
from app.stage_plans import run_stages
from app.vllm_report import plan_for_vllm, render_vllm
from kvcache.engines import engine_rules
from kvcache.engines.vllm import VLLM
from kvcache.inputs.cards import SimulatedCard
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.model_config import ModelConfig
from kvcache.models.model_page_size import note_on_page_size


def plan_output(server_args: ServerArgs, model: ModelConfig, card: SimulatedCard, *, as_json: bool) -> str | None:
    """What this process prints for `plan` (None on a rank other than 0)."""

    def plan_rank(state: ParallelState) -> str | None:
        rules = engine_rules(server_args.engine)  # an --engine not available yet stops here, before any weights
        if rules is VLLM:  # vLLM's answer is its own block plan: no pools are planned (kvcache.engines.vllm)
            return render_vllm(plan_for_vllm(server_args, model, state, card), as_json=as_json)
        run = dry_run(server_args, model, card, state)
        report = build_report(run, rules=rules, card=card.name,
                              page_size_note=note_on_page_size(server_args.page_size, model))
        return render_for_this_rank(run, report, as_json=as_json)  # rank 0 gathers every rank's plan

    if launched_world_size(os.environ) > 1:  # torchrun's ranks: each plans its own, over the process group
        from app.parallel_setup import parallel_state_resource

        with contextlib.contextmanager(parallel_state_resource)(server_args) as state:
            return plan_rank(state)
    if server_args.pp_size > 1 and server_args.engine != VLLM.name:
        return run_stages(server_args, plan_rank, num_layers=model.num_hidden_layers)  # every stage, as its rank would
    return plan_rank(single_process_state(server_args))
