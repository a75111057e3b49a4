"""`plan --pp-size N` in one process: every pipeline stage planned as its rank would plan it under torchrun.

Each stage starts (app.dry_run: planned, nothing built) in a thread of its own with a ParallelState
for that stage, and the stages agree through the ranks' own collectives (kvcache.inputs.in_process_group):
the smallest free memory, then the smallest stage's tokens, which every stage keeps. Stage 0
prints, as rank 0 does, with a `stages` table (`stages` in --json). A stage that fails outside a
collective aborts the others; the error raised is the lowest failing stage's.
"""

from __future__ import annotations

import threading
from typing import Callable

from kvcache.inputs.parallel import ParallelState, ProcessGroups
from kvcache.inputs.pipeline_stages import stage_layer_counts
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.in_process_group import InProcessGroup


def stage_state(server_args: ServerArgs, stage: int, group: InProcessGroup) -> ParallelState:
    """Stage `stage`'s first TP rank, agreeing with the other stages over `group`."""
    a = server_args
    return ParallelState(tp_size=a.tp_size, pp_size=a.pp_size, pp_rank=stage, pp_layer_partition=a.pp_layer_partition,
                         attention_dp_size=a.attention_dp_size,
                         min_rank_memory_ratio=a.min_rank_memory_ratio,
                         groups=ProcessGroups(agreement=group, tp=None, pp=None, attention_tp=None, attention_dp=None))


def run_stages(server_args: ServerArgs, run_one: Callable[[ParallelState], str | None], *,
               num_layers: int) -> str | None:
    """`run_one` for each stage's ParallelState, each in its own thread; stage 0's output (the others print
    nothing)."""
    stages = server_args.pp_size
    stage_layer_counts(num_layers, stages, server_args.pp_layer_partition)  # a split that cannot be: refused before any thread starts
    group = InProcessGroup(stages)
    outputs: list[str | None] = [None] * stages
    errors: list[BaseException | None] = [None] * stages

    def stage_work(stage: int) -> None:
        try:
            outputs[stage] = run_one(stage_state(server_args, stage, group))
        except BaseException as exc:  # noqa: BLE001 - carried to the main thread, which raises the first
            errors[stage] = exc
            group.abort()

    threads = [threading.Thread(target=stage_work, args=(s,), name=f"pp-stage-{s}") for s in range(stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if failed:
        raise failed[0]
    if any(errors):
        raise next(e for e in errors if e is not None)
    return outputs[0]
