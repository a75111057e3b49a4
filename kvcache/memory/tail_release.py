"""Which mapped blocks of a virtual-memory pool to drop, keep or remap when only some byte ranges stay (pure).

A VMM-backed allocation is mapped as blocks, each its own physical handle (the driver
unmaps whole handles only). After a resize each per-layer buffer keeps its first
rows: a block outside every kept range is dropped, a block inside one is kept, and a
block that straddles a boundary is remapped as runs of `granularity`-sized pieces
that touch a kept range, its kept bytes copied across. What stays mapped exceeds the
kept bytes by less than two granules per kept range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence
from kvcache.arithmetic import align_up


@dataclass(frozen=True, slots=True)
class Block:
    """A mapped byte range [offset, offset + size) of one allocation."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True, slots=True)
class TailRelease:
    """The outcome: blocks kept as they are, blocks unmapped, and straddling blocks with their replacements."""

    kept: tuple[Block, ...]
    dropped: tuple[Block, ...]
    remapped: tuple[tuple[Block, tuple[Block, ...]], ...]

    @property
    def blocks_after(self) -> tuple[Block, ...]:
        """Every block mapped once the release is done, in address order."""
        return tuple(sorted((*self.kept, *(b for _, parts in self.remapped for b in parts)), key=lambda b: b.offset))

    @property
    def mapped_bytes_after(self) -> int:
        return sum(b.size for b in self.blocks_after)


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covered(start: int, end: int, keep: list[tuple[int, int]]) -> int:
    return sum(max(0, min(end, e) - max(start, s)) for s, e in keep)


def plan_tail_release(blocks: Sequence[Block], keep: Sequence[tuple[int, int]], granularity: int) -> TailRelease:
    """Split `blocks` by the byte ranges `keep` ([start, end) offsets); blocks are granularity-aligned."""
    ranges = _merged(keep)
    kept: list[Block] = []
    dropped: list[Block] = []
    remapped: list[tuple[Block, tuple[Block, ...]]] = []
    for block in blocks:
        if block.offset % granularity or block.size % granularity:
            raise ValueError(f"block {block} is not aligned to the {granularity}-byte granularity")
        covered = _covered(block.offset, block.end, ranges)
        if covered == 0:
            dropped.append(block)
        elif covered == block.size:
            kept.append(block)
        else:
            remapped.append((block, _runs(block, ranges, granularity)))
    return TailRelease(kept=tuple(kept), dropped=tuple(dropped), remapped=tuple(remapped))


def _runs(block: Block, ranges: list[tuple[int, int]], granularity: int) -> tuple[Block, ...]:
    """Maximal runs of granules of `block` that touch a kept range."""
    runs: list[Block] = []
    for start in range(block.offset, block.end, granularity):
        if _covered(start, start + granularity, ranges) == 0:
            continue
        if runs and runs[-1].end == start:
            runs[-1] = Block(runs[-1].offset, runs[-1].size + granularity)
        else:
            runs.append(Block(start, granularity))
    return tuple(runs)


def chunk_blocks(nbytes: int, chunk_bytes: int, granularity: int) -> tuple[Block, ...]:
    """How an allocation of nbytes is first mapped: chunk_bytes blocks, the last rounded up to the granularity."""
    if chunk_bytes % granularity:
        raise ValueError(f"chunk size {chunk_bytes} is not a multiple of the granularity {granularity}")
    total = align_up(nbytes, granularity)
    return tuple(Block(off, min(chunk_bytes, total - off)) for off in range(0, total, chunk_bytes))
