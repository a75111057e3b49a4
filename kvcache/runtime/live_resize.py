"""The one road that resizes live KV pools on VMM storage to a plan: on every rank, or on none.

Both resizes take it: the post-capture shrink (app.forward.post_capture) and the measured sizing's
resizes, to the static plan and then to the measured one (app.forward.measured_sizing). Addresses
never move, so captured CUDA graphs stay valid: each per-token buffer keeps, or maps again, the
plan's rows and the padding page, and the rest of its rows is unmapped. Two steps, each agreed by
the ranks (RankAgreement.run_everywhere), so no rank starts the second before every rank finished
the first:
1. a fresh allocator from the worker's factory for the plan's tokens, holding exactly the old one's tokens in use
   (refused, with nothing changed, when one lies past the plan's tokens); the old one is drained meanwhile. Its
   index lists are the resized plan's allocator slots (MemoryPoolConfig.allocator_slots), carved from an arena of
   their own beside the old lists, outside the worker's arena (the old lists stay there, mapped, until the arena
   goes); the budget each resize decides leaves room for them (resize_slack_bytes);
2. each allocation holding a pool buffer mapped to its target: grown back into its reserved
   addresses, or its buffers' tails released.
A failure on any rank undoes both on every rank (the old allocator's free tokens back first, then
each allocation mapped exactly as it was) and every rank raises the same error (a rank whose
mapping back fails too raises the driver's error instead); the pool takes the plan's part (its size,
nbytes and named tensors: kvcache.pools.planned_views.PlannedRows) only once every rank succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.inputs.rank_agreement import RankAgreement
from kvcache.memory.vmm_storage import VmmAllocation, VmmBacking
from kvcache.pools.allocator_protocol import AllocatorFactory
from kvcache.pools.planned_views import slots_nbytes
from kvcache.runtime.shrink import (
    AllocatorSwap, carry_tokens_in_use, carry_transient_bytes, complement, pool_buffers, released_address_ranges,
)
from kvcache.sizing.pool_config import MemoryPoolConfig

Ranges = list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class PoolsResized:
    """What a resize did: the allocator to use from now on, and the device bytes it mapped and released."""

    allocator: Any
    mapped_bytes: int
    released_bytes: int


def resize_live_pools(*, pool: Any, allocator: Any, backing: VmmBacking, plan: MemoryPoolConfig,
                      ranks: RankAgreement, allocator_factory: AllocatorFactory) -> PoolsResized:
    """`pool` addressed by `plan`'s tokens, with a fresh allocator for them (the module docstring's two steps).

    Every rank calls it (each step is a collective). The fresh allocator is `allocator_factory`'s for `plan` (the
    resized MemoryPoolConfig: its sizes and index lists are that plan's allocator slots), given no views: its lists
    are allocated beside the old allocator's, outside the worker's arena, and resize_slack_bytes counts them in
    the margin each resize keeps. It checks frees as `allocator` did."""
    tokens = plan.max_total_num_tokens
    targets: list[tuple[VmmAllocation, Ranges]] = []
    before: list[tuple[VmmAllocation, Ranges]] = []
    swap: AllocatorSwap | None = None

    def swap_allocator() -> None:
        nonlocal swap
        pool.check_resize(plan)  # its part of the plan, within the rows it was built with (nothing changes)
        targets.extend(mapping_targets(backing, pool_buffers(pool), tokens + plan.page_size))
        fresh = allocator_factory(plan=plan, device=allocator.device, kvcache=pool, check_frees=allocator.check_frees)
        swap = carry_tokens_in_use(allocator, fresh)

    try:
        ranks.run_everywhere(swap_allocator)
        mapped, released = ranks.run_everywhere(lambda: map_to_targets(targets, before))
    except BaseException:
        if swap is not None:
            swap.undo()  # the old allocator as it was, first: mapping back below can fail too
        restore_mapping(before)
        raise
    pool.resize(plan)  # its size, nbytes and named tensors are the plan's rows from now on
    assert swap is not None
    return PoolsResized(allocator=swap.allocator, mapped_bytes=mapped, released_bytes=released)


def resize_slack_bytes(*, backing: VmmBacking, pool: Any, plan: MemoryPoolConfig, allocator: Any) -> int:
    """What a resize of the pools built for `plan` holds beyond the plan it resizes to, which the budget it decides
    leaves room for: two granules per per-token buffer (a released tail keeps the granules it starts and ends in
    mapped), and the built allocator's index lists, which stay mapped in the arena while the fresh allocator's
    (the ones the resized plan counts) sit beside them: `plan`'s allocator slots, with the is_free flags when
    `allocator` checks frees; and what the swap itself holds meanwhile (carry_transient_bytes)."""
    fresh = slots_nbytes(plan.allocator_slots(check_frees=allocator.check_frees))
    tokens = plan.max_total_num_tokens
    carry = carry_transient_bytes(tokens=max(tokens, allocator.size), grown_tokens=tokens - allocator.size)
    return 2 * backing.granularity * len(pool_buffers(pool)) + fresh + carry


def mapping_targets(backing: VmmBacking, buffers: list[torch.Tensor], rows: int) -> list[tuple[VmmAllocation, Ranges]]:
    """Each allocation holding a pool buffer, with the [start, end) offsets to map when every buffer keeps its first
    `rows` rows: all of it but the buffers' rows past `rows` (the request table and allocator lists share the arena
    and stay). A buffer with no rows past `rows` releases nothing, and its empty tail is looked for nowhere (it may
    start at its allocation's very end)."""
    tails: dict[int, tuple[VmmAllocation, Ranges]] = {}
    for t in buffers:
        allocation = backing.allocation_at(t.data_ptr())
        tails.setdefault(id(allocation), (allocation, []))
    for start, end in released_address_ranges(buffers, rows):
        allocation = backing.allocation_at(start)
        tails[id(allocation)][1].append((start - allocation.base, end - allocation.base))
    return [(a, complement(ranges, 0, a.reserved)) for a, ranges in tails.values()]


def map_to_targets(targets: list[tuple[VmmAllocation, Ranges]], before: list[tuple[VmmAllocation, Ranges]]
                   ) -> tuple[int, int]:
    """Step 2 on this rank: each allocation mapped over its target, what it was mapped over first noted in `before`
    (for the undo); returns (bytes mapped, bytes released). The fault matrix fails a resize here, after step 1."""
    mapped = released = 0
    for allocation, ranges in targets:
        before.append((allocation, allocation.mapped_ranges))
        grown, dropped = map_exactly(allocation, ranges)
        mapped, released = mapped + grown, released + dropped
    return mapped, released


def map_exactly(allocation: VmmAllocation, ranges: Ranges) -> tuple[int, int]:
    """Map the parts of `ranges` not mapped, then unmap what lies outside them (whole granules: bytes of a granule
    that `ranges` touch stay); each call is made only when it has something to do. Returns (mapped, released)."""
    mapped = allocation.map_within(ranges) if _outside(ranges, allocation.mapped_ranges) else 0
    released = allocation.keep_only(ranges) if _outside(allocation.mapped_ranges, ranges) else 0
    return mapped, released


def restore_mapping(before: list[tuple[VmmAllocation, Ranges]]) -> None:
    """Each allocation mapped over exactly what it was before the resize (what was released mapped again, its values
    undefined; what was grown unmapped); each is tried, and the first failure is raised after."""
    failure: BaseException | None = None
    for allocation, ranges in before:
        try:
            map_exactly(allocation, ranges)
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def _outside(ranges: Ranges, of: Ranges) -> bool:
    """Whether any byte of `ranges` lies outside every range of `of`."""
    return any(complement(of, start, end) for start, end in ranges)
