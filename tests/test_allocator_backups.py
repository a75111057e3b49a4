"""The three backup state machines (free log, full -> SWA map, SWA allocator) share one base: only the latest
backup of the object that made it restores."""

from __future__ import annotations

import pytest
import torch

from kvcache.allocators.backups import BackupState, LatestBackup
from kvcache.allocators.free_log import FreeLogState
from kvcache.allocators.index_map import FullToSWAMap, IndexMapState
from kvcache.sizing.allocator_footprint import full_to_swa_slot
from kvcache.allocators.swa import SWAAllocatorState
from kvcache.testing.allocator_plans import swa_allocator


def test_the_three_state_types_are_one_kind_of_backup() -> None:
    assert all(issubclass(t, BackupState) for t in (FreeLogState, IndexMapState, SWAAllocatorState))


def test_only_the_latest_backup_of_its_own_owner_restores() -> None:
    a, b = LatestBackup(), LatestBackup()
    first = BackupState(owner=a.owner, generation=a.advance())
    a.check(first)
    with pytest.raises(ValueError, match=r"allocator state \(backup #1\) is not the latest backup of this allocator"):
        b.check(BackupState(owner=a.owner, generation=b.advance()))  # same generation, another owner
    a.advance()  # a newer backup, or a clear
    with pytest.raises(ValueError, match=r"\(latest is #2; a newer backup_state\(\) or a clear\(\) replaced it\)"):
        a.check(first)


def test_a_reset_map_refuses_its_backup_and_a_cleared_swa_allocator_its_own() -> None:
    table = FullToSWAMap(slot=full_to_swa_slot(8), device=torch.device("cpu"))
    mark = table.mark()
    table.reset()
    with pytest.raises(ValueError, match=r"index map state \(backup #1\) is not the latest backup \(latest is #2\)"):
        table.restore(mark)
    swa = swa_allocator(full_size=16, swa_size=8, page_size=1, device="cpu")
    state = swa.backup_allocator_state()
    swa.clear()
    with pytest.raises(ValueError, match="not the latest backup of this allocator"):
        swa.restore_allocator_state(state)
