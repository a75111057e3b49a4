"""VMM storage on the CPU through kvcache.testing's fake driver: keep_only keeps the kept bytes mapped, also when it fails.

The allocation is 16 granules of 4 KiB in chunks of 4 granules; keeping [0, 5 granules + 3 B)
keeps chunk 0, remaps chunk 1 as its first two granules (the second holds the last 3 kept
bytes), and drops chunks 2 and 3.
"""

from __future__ import annotations

import pytest
import torch

from kvcache.memory.tail_release import Block
from kvcache.testing.virtual_memory import POISON, FakeVirtualMemory
from kvcache.errors import VmmError
from kvcache.memory.vmm_storage import VmmAllocation, VmmBacking

G = 4096
CPU = torch.device("cpu")
KEEP = [(0, 5 * G + 3)]


def _filled(memory: FakeVirtualMemory) -> tuple[VmmAllocation, torch.Tensor]:
    allocation = VmmAllocation(16 * G, CPU, chunk_bytes=4 * G, memory=memory)
    pattern = torch.arange(16 * G).remainder(251).to(torch.uint8)
    allocation.view(0, 16 * G).copy_(pattern)
    return allocation, pattern


def test_keep_only_releases_whole_granules_outside_the_kept_range_and_keeps_its_bytes():
    memory = FakeVirtualMemory(granularity=G)
    allocation, pattern = _filled(memory)
    assert memory.physical_bytes == allocation.mapped_bytes == 16 * G
    assert allocation.keep_only(KEEP) == 10 * G  # chunks 2 and 3, and 2 granules of chunk 1
    assert allocation.blocks == (Block(0, 4 * G), Block(4 * G, 2 * G))
    assert memory.physical_bytes == 6 * G
    assert torch.equal(allocation.view(0, 6 * G), pattern[:6 * G])  # the kept bytes and their granule
    assert bool((allocation.view(6 * G, 10 * G) == POISON).all())  # nothing mapped there now


@pytest.mark.parametrize("call, after", [("map", 0), ("create", 0)])
def test_a_replacement_that_cannot_be_made_or_mapped_leaves_every_byte_mapped_and_the_kept_bytes_intact(call, after):
    memory = FakeVirtualMemory(granularity=G)
    allocation, pattern = _filled(memory)
    memory.fail(call, after=after)
    with pytest.raises(VmmError, match=f"{call} failed"):
        allocation.keep_only(KEEP)
    assert torch.equal(allocation.view(0, KEEP[0][1]), pattern[:KEEP[0][1]])
    assert allocation.mapped_bytes == memory.physical_bytes == 16 * G  # the dropped chunks are mapped again
    assert allocation.keep_only(KEEP) == 10 * G  # and a second try succeeds
    assert torch.equal(allocation.view(0, KEEP[0][1]), pattern[:KEEP[0][1]])


@pytest.mark.parametrize("after", [0, 1, 2])  # a dropped chunk's unmap, the other's, the straddling one's
def test_an_unmap_that_fails_leaves_the_block_recorded_and_every_byte_mapped(after):
    """The handle was forgotten before cuMemUnmap ran: a failed unmap left that block mapped but untracked, so
    mapping the gaps back collided with it and the allocation could neither be restored nor closed."""
    memory = FakeVirtualMemory(granularity=G)
    allocation, pattern = _filled(memory)
    memory.fail("unmap", after=after)
    with pytest.raises(VmmError, match="unmap failed"):
        allocation.keep_only(KEEP)
    assert allocation.mapped_bytes == memory.physical_bytes == 16 * G
    assert torch.equal(allocation.view(0, KEEP[0][1]), pattern[:KEEP[0][1]])
    assert allocation.keep_only(KEEP) == 10 * G
    allocation.close()
    assert memory.physical_bytes == 0


@pytest.mark.parametrize("call", ["unmap", "create"])
def test_a_failed_release_maps_back_only_what_it_unmapped(call):
    """Chunk 3 was released by an earlier resize; a later release that fails maps back its own blocks, not chunk 3:
    on a device short of memory that mapping could fail too and hide the first error."""
    memory = FakeVirtualMemory(granularity=G)
    allocation, pattern = _filled(memory)
    assert allocation.keep_only([(0, 12 * G)]) == 4 * G
    memory.fail(call, after=0 if call == "create" else 1)
    with pytest.raises(VmmError, match=f"{call} failed"):
        allocation.keep_only(KEEP)
    assert allocation.mapped_bytes == memory.physical_bytes == 12 * G
    assert torch.equal(allocation.view(0, KEEP[0][1]), pattern[:KEEP[0][1]])
    assert allocation.keep_only(KEEP) == 6 * G


def test_on_a_full_device_the_dropped_chunks_make_room_for_the_replacement():
    memory = FakeVirtualMemory(granularity=G, capacity_bytes=16 * G)  # all of it mapped: nothing else free
    allocation, pattern = _filled(memory)
    assert allocation.keep_only(KEEP) == 10 * G
    assert torch.equal(allocation.view(0, KEEP[0][1]), pattern[:KEEP[0][1]])


def test_a_backing_finds_its_allocation_by_address_and_closing_releases_everything():
    memory = FakeVirtualMemory(granularity=G)
    backing = VmmBacking(chunk_bytes=4 * G, memory=lambda device: memory)
    tensor = backing(10 * G + 1, CPU)
    (allocation,) = backing.allocations
    assert backing.allocation_at(tensor.data_ptr() + 10 * G) is allocation and allocation.reserved == 11 * G
    with pytest.raises(KeyError):
        backing.allocation_at(tensor.data_ptr() + 11 * G)
    allocation.close()
    assert memory.physical_bytes == 0


def test_the_driver_refusing_physical_memory_is_does_not_fit_not_a_bug():
    """A resizable pool past the device's memory (cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY) was reported as an
    internal error (exit 1, 'a bug in kvcache') instead of exit 3; a driver error that is no refusal stays a bug."""
    from app.failures import failure_of
    from kvcache.memory.out_of_memory import is_out_of_memory

    memory = FakeVirtualMemory(granularity=G, capacity_bytes=4 * G)
    backing = VmmBacking(chunk_bytes=4 * G, memory=lambda device: memory)
    with pytest.raises(VmmError) as refused:
        backing(8 * G, torch.device("cpu"))
    assert is_out_of_memory(refused.value) and failure_of(refused.value).exit_code == 3
    assert not is_out_of_memory(VmmError("cuMemMap failed: <CUresult.CUDA_ERROR_INVALID_VALUE: 1>"))
