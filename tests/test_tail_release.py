"""Releasing the tails of a VMM-backed pool: which blocks are dropped, kept and remapped (pure, by hand)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvcache.memory.tail_release import Block, chunk_blocks, plan_tail_release

G = 2 << 20  # 2 MiB, an H200's VMM granularity


def test_an_allocation_is_mapped_in_chunks_and_a_granule_aligned_tail():
    assert chunk_blocks(10 * G + 1, 4 * G, G) == (Block(0, 4 * G), Block(4 * G, 4 * G), Block(8 * G, 3 * G))
    with pytest.raises(ValueError, match="multiple of the granularity"):
        chunk_blocks(G, 3 * G // 2, G)


def test_two_buffers_keep_their_heads_the_tails_are_dropped_and_the_boundaries_remapped():
    # one 16 G allocation in 4 G chunks holding two 8 G buffers; each keeps its first 3.5 G
    blocks = chunk_blocks(16 * G, 4 * G, G)
    release = plan_tail_release(blocks, [(0, 7 * G // 2), (8 * G, 8 * G + 7 * G // 2)], G)
    assert release.kept == ()
    assert release.dropped == (Block(4 * G, 4 * G), Block(12 * G, 4 * G))
    assert release.remapped == ((Block(0, 4 * G), (Block(0, 4 * G),)), (Block(8 * G, 4 * G), (Block(8 * G, 4 * G),)))
    # keeping 2.5 G of each: the boundary chunks shrink to three granules
    release = plan_tail_release(blocks, [(0, 5 * G // 2), (8 * G, 8 * G + 5 * G // 2)], G)
    assert [parts for _, parts in release.remapped] == [(Block(0, 3 * G),), (Block(8 * G, 3 * G),)]
    assert release.mapped_bytes_after == 6 * G


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64 * G), st.integers(0, 8 * G)), max_size=6), st.sampled_from([G, 4 * G]))
def test_every_kept_byte_stays_mapped_and_at_most_two_granules_per_range_more(ranges, chunk):
    keep = [(s, min(s + n, 64 * G)) for s, n in ranges]
    release = plan_tail_release(chunk_blocks(64 * G, chunk, G), keep, G)
    after = release.blocks_after
    mapped = {g for b in after for g in range(b.offset // G, b.end // G)}
    touched = {g for s, e in keep if e > s for g in range(s // G, (e - 1) // G + 1)}
    assert touched <= mapped
    assert release.mapped_bytes_after <= sum(e - s for s, e in keep) + 2 * G * len(keep)
    assert all(b.offset % G == 0 and b.size % G == 0 for b in after)
