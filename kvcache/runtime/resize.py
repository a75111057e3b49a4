"""The post-capture resize as pure functions: numbers measured after CUDA-graph capture in, a smaller plan out.

Before capture the pools were built for the plan's budget. After capture the runner
measures what is free; the pools may keep everything except the headroom that
`mem_fraction_static` names (free_before_load * (1 - fraction), SGLang 0.5.23's
rule; at least the eager activation reserve when decode batches can outgrow the
largest captured graph). If free memory is below that headroom, the plan is redone
by the same pure planner for the smaller budget; it never grows, so captured
pointers (the pools' virtual addresses) stay valid and only each buffer's tail is
released.
"""

from __future__ import annotations

from fractions import Fraction

import msgspec

from kvcache.byte_units import MiB, format_bytes
from kvcache.errors import DoesNotFitError
from kvcache.sizing.memory_budget import headroom_bytes
from kvcache.arithmetic import align_up
from kvcache.sizing.planning import plan_cost, plan_pool_sizes
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.resized_plan import resized_plan_request


class PostCaptureResizeError(DoesNotFitError):
    """After capture, what is free (plus the pools) cannot keep the headroom and one request's KV."""


class PostCaptureKVResize(msgspec.Struct, frozen=True, kw_only=True):
    """The decision: the plan before and after, and the measurements it came from (bytes)."""

    before: MemoryPoolConfig
    after: MemoryPoolConfig
    free_after_capture_bytes: int
    headroom_bytes: int
    mapping_slack_bytes: int

    @property
    def tokens_before(self) -> int:
        return self.before.max_total_num_tokens

    @property
    def tokens_after(self) -> int:
        return self.after.max_total_num_tokens

    @property
    def changed(self) -> bool:
        return self.tokens_after != self.tokens_before

    @property
    def released_bytes(self) -> int:
        """Planned bytes the resize gives back: the plans' difference (KV tails, and the shorter free lists the
        resized plan charges). On the device only the tails go (the runner's post_capture_released_bytes, in whole
        granules): the old lists stay in the arena and the fresh allocator's are allocated beside it."""
        return self.before.total_bytes - self.after.total_bytes


def post_capture_headroom_bytes(
    *, plan: MemoryPoolConfig, pre_model_load_bytes: int, cuda_graph_max_bs: int, activation_reserve_mib: Fraction,
) -> int:
    """Bytes to leave free after the resize: what the plan's fraction kept back, and the eager
    activation reserve too when max_running_requests exceeds the largest captured batch; plus what the
    budget reserved for buffers allocated after it (SGLang 0.5.23 keeps its multimodal reserve here too)."""
    fraction = plan.budget.mem_fraction_static
    if fraction is None:
        raise ValueError("a plan made from --kv-cache-memory has no fraction to keep headroom by; it is not resized")
    headroom = headroom_bytes(pre_model_load_bytes, fraction)
    if plan.max_running_requests > cuda_graph_max_bs:
        headroom = max(headroom, int(activation_reserve_mib * MiB))
    return headroom + plan.budget.reserved_bytes


def compute_post_capture_kv_resize(
    *, plan: MemoryPoolConfig, free_after_capture_bytes: int, headroom_bytes: int, mapping_slack_bytes: int = 0,
) -> PostCaptureKVResize:
    """Shrink-only: the largest plan no bigger than `plan` that leaves `headroom_bytes` free.

    `mapping_slack_bytes` is what releasing tails in whole device pages may keep beyond
    the plan (one page per buffer at most); it comes out of the budget. The request
    table keeps its rows, so a resize that would lower max_running_requests is refused.
    """
    spare = free_after_capture_bytes - headroom_bytes
    if spare >= 0:
        return PostCaptureKVResize(before=plan, after=plan, free_after_capture_bytes=free_after_capture_bytes,
                                   headroom_bytes=headroom_bytes, mapping_slack_bytes=mapping_slack_bytes)
    budget = plan.total_bytes + spare - mapping_slack_bytes
    try:
        after = plan_pool_sizes(resized_plan_request(plan, max(budget, 0)))
    except DoesNotFitError as exc:
        raise _cannot_resize(plan, free_after_capture_bytes, headroom_bytes, exc.needed_bytes) from None
    if after.max_running_requests != plan.max_running_requests:
        raise _cannot_resize(plan, free_after_capture_bytes, headroom_bytes, _bytes_to_keep_running_requests(plan))
    return PostCaptureKVResize(before=plan, after=after, free_after_capture_bytes=free_after_capture_bytes,
                               headroom_bytes=headroom_bytes, mapping_slack_bytes=mapping_slack_bytes)


def _bytes_to_keep_running_requests(plan: MemoryPoolConfig) -> int:
    """What the smallest plan that keeps `plan`'s running requests allocates (each request needs two tokens),
    by the planner's own cost, so it compares with the whole-plan bytes the error says are available."""
    tokens = align_up(2 * plan.max_running_requests, plan.page_size)
    return plan_cost(resized_plan_request(plan, plan.budget.budget_bytes), tokens, 0)


def _cannot_resize(plan: MemoryPoolConfig, free: int, headroom: int, needed: int) -> PostCaptureResizeError:
    return PostCaptureResizeError(
        f"after CUDA-graph capture {format_bytes(free)} is free, {format_bytes(headroom - free)} short of the "
        f"{format_bytes(headroom)} headroom; shrinking the {plan.max_total_num_tokens:,}-token pools cannot make "
        f"room while keeping {plan.max_running_requests:,} running requests",
        needed_bytes=needed, available_bytes=max(plan.total_bytes + free - headroom, 0),
        suggestions=("a lower --cuda-graph-max-bs (captured graphs take less)",
                     "a lower --max-running-requests",
                     "--mem-fraction-static 0.05 lower (more headroom before capture)"),
    )
