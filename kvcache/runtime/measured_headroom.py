"""Measured headroom as pure decisions: the worst-case step's measured peak in, the KV token count out.

After CUDA-graph capture the engine runs its largest steps (a full prefill chunk; an eager
decode batch above the largest graph; a mixed chunk with --enable-mixed-chunk; for MLA, the
chunk over a cached context it up-projects) and measures each one's peak. The pools then keep
everything but the peak plus a margin. Two rules bound the answer:
- never fewer tokens than the static plan (SGLang's fraction's tokens, in the pools and request table as
  built: kvcache.sizing.static_floor), unless the measurement shows
  that the static plan itself runs out of memory at that step; the decision then says so,
  with the bytes;
- never more than the plan the pools were built for (the resize releases tails, it maps
  back only what it released).

The peak is the largest of each step alone and of the steps run twice in turn: the caching
allocator keeps the blocks of one step cached, and the next step's sizes cannot reuse them
(on an H200, Llama-3.1-8B's prefill chunk and eager decode took 1.58 and 3.63 GB alone and
4.57 GB in turn). The margin is kvcache.sizing.measured_prediction.MEASURED_MARGIN (0.5% of the card, at least 256 MiB): what
the measurement does not see, requests unlike the measured ones (other prefix lengths, other
routed-expert counts) and workspaces other kernels create later; on an H200 it is 0.70 GiB,
well below the 2% of the card that may sit idle at the worst-case step's peak.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from kvcache.errors import DoesNotFitError
from kvcache.byte_units import format_bytes
from kvcache.sizing.planning import plan_pool_sizes
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.resized_plan import resized_plan_request



class WorstCaseStep(Protocol):
    """The engine's largest steps, run through the live pools: names() lists them, run(name) runs one."""

    def names(self) -> tuple[str, ...]: ...

    def run(self, name: str) -> None: ...


class StepPeak(msgspec.Struct, frozen=True, kw_only=True):
    """One step's measured peak (bytes): the caching allocator's reserved growth, and the drop of
    cudaMemGetInfo's free bytes during the step less what stayed taken after its blocks were released."""

    name: str
    torch_peak_bytes: int  # max_memory_reserved during the step - memory_reserved before it
    free_drop_bytes: int  # cudaMemGetInfo: free before - free right after (the step's blocks still cached)
    lasting_bytes: int  # free before - free after the cache was emptied (context growth: kernels, workspaces)

    @property
    def peak_bytes(self) -> int:
        """What the step needs free on top of what stays: the larger of the two readings."""
        return max(self.torch_peak_bytes, self.free_drop_bytes - self.lasting_bytes)


class MeasuredSizing(msgspec.Struct, frozen=True, kw_only=True):
    """The decision and what it came from (bytes): the report's and --json's `measured_headroom`."""

    steps: tuple[StepPeak, ...]
    graph_bytes: int  # free memory CUDA-graph capture took
    margin_bytes: int
    tokens_built: int  # the plan the pools were built for (the higher fraction)
    static_tokens: int  # SGLang's fraction's plan: the floor
    tokens_after: int
    free_after_steps_bytes: int  # free once the steps ran and their blocks were released, pools at the static plan
    plan_after: MemoryPoolConfig
    note: str  # why the static floor held or was broken; "" when the measurement decided alone
    free_after_resize_bytes: int = 0  # cudaMemGetInfo once the pools hold tokens_after (caches released)

    @property
    def peak_bytes(self) -> int:
        return max((s.peak_bytes for s in self.steps), default=0)

    @property
    def worst_step(self) -> str:
        return max(self.steps, key=lambda s: s.peak_bytes).name if self.steps else "none"

    @property
    def headroom_bytes(self) -> int:
        """What the pools leave free: the measured peak plus the margin."""
        return self.peak_bytes + self.margin_bytes

    @property
    def idle_bytes(self) -> int:
        """Free memory while the worst-case step is at its peak: what nothing uses."""
        return self.free_after_resize_bytes - self.peak_bytes

    def to_dict(self) -> dict[str, object]:
        """The report's `measured_headroom` (bytes and tokens; the per-step readings by name)."""
        return {
            "peak_bytes": self.peak_bytes, "worst_step": self.worst_step, "graph_bytes": self.graph_bytes,
            "margin_bytes": self.margin_bytes, "headroom_bytes": self.headroom_bytes,
            "tokens_built": self.tokens_built, "static_tokens": self.static_tokens, "tokens_after": self.tokens_after,
            "free_after_steps_bytes": self.free_after_steps_bytes, "free_after_resize_bytes": self.free_after_resize_bytes,
            "idle_bytes": self.idle_bytes, "note": self.note,
            "steps": {s.name: {"peak_bytes": s.peak_bytes, "torch_peak_bytes": s.torch_peak_bytes,
                               "free_drop_bytes": s.free_drop_bytes, "lasting_bytes": s.lasting_bytes}
                      for s in self.steps},
        }


def decide_measured_tokens(
    *, built: MemoryPoolConfig, static: MemoryPoolConfig, free_at_static_bytes: int, peak_bytes: int,
    margin_bytes: int, mapping_slack_bytes: int,
) -> tuple[MemoryPoolConfig, str]:
    """(the plan to keep, a note). `free_at_static_bytes` is free memory with the pools at the static plan
    and the steps' blocks released; the kept plan leaves peak + margin of it free, at least the static
    plan's tokens unless even those leave less than the peak (then the note says so), at most `built`'s."""
    spare = free_at_static_bytes - peak_bytes - margin_bytes - mapping_slack_bytes
    budget = static.total_bytes + spare
    try:
        after = plan_pool_sizes(resized_plan_request(built, max(budget, 0)))
    except DoesNotFitError:
        after = None
    if after is not None and after.max_total_num_tokens >= static.max_total_num_tokens:
        return after, ""
    if free_at_static_bytes - mapping_slack_bytes >= peak_bytes:
        return static, (f"kept the static plan's {static.max_total_num_tokens:,} tokens: it leaves "
                        f"{format_bytes(free_at_static_bytes)} free, under the measured peak + margin "
                        f"{format_bytes(peak_bytes + margin_bytes)} but above the peak {format_bytes(peak_bytes)}")
    oom = (f"the static plan's {static.max_total_num_tokens:,} tokens would run out of memory at the worst-case step: "
           f"it leaves {free_at_static_bytes:,} B free and the step needs {peak_bytes:,} B")
    if after is None:
        raise DoesNotFitError(oom + "; no smaller plan keeps the margin either", needed_bytes=peak_bytes + margin_bytes,
                              available_bytes=free_at_static_bytes + static.total_bytes,
                              suggestions=("a smaller --chunked-prefill-size", "a lower --max-running-requests"))
    return after, oom


def agreed_plan(plan: MemoryPoolConfig, built: MemoryPoolConfig, agreed_tokens: int) -> MemoryPoolConfig:
    """`plan` capped at the ranks' smallest token count (re-planned within its own budget). That count is another
    rank's plan, which may cap each request below the context (a static floor does), so this one may too, whatever
    `built`'s own rule (its below_one_request)."""
    if plan.max_total_num_tokens <= agreed_tokens:
        return plan
    request = resized_plan_request(built, plan.budget.budget_bytes)
    return plan_pool_sizes(msgspec.structs.replace(request, max_total_tokens=agreed_tokens, below_one_request="cap"))
