"""Latest-backup bookkeeping that the free log, the full -> SWA map and the SWA allocator share.

Each of the three keeps one backup at a time: a backup is an opaque (owner, generation) pair;
a newer backup, a clear or a reset moves the generation on, and only the latest backup restores.
`BackupState` is the pair each one's state type extends; `LatestBackup` counts and checks it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

_owners = itertools.count(1)
ALLOCATOR_STATE = ("allocator state", " of this allocator", "; a newer backup_state() or a clear() replaced it")


@dataclass(frozen=True, slots=True)
class BackupState:
    """An opaque backup: which object made it and which backup generation (the object keeps the rest)."""

    owner: int
    generation: int


class LatestBackup:
    """One object's backup generations. `subject`, `of_what` and `why` phrase the refusal of a stale backup."""

    __slots__ = ("owner", "generation", "_subject", "_of_what", "_why")

    def __init__(self, subject: str = ALLOCATOR_STATE[0], of_what: str = ALLOCATOR_STATE[1],
                 why: str = ALLOCATOR_STATE[2]) -> None:
        self.owner = next(_owners)
        self.generation = 0
        self._subject, self._of_what, self._why = subject, of_what, why

    def advance(self) -> int:
        """A new backup was taken (or everything was cleared): every earlier one is void. The new generation."""
        self.generation += 1
        return self.generation

    def check(self, state: BackupState, *, restorable: bool = True) -> None:
        """Refuse a backup that is not this object's latest (or that the object cannot restore any more)."""
        if state.owner != self.owner or state.generation != self.generation or not restorable:
            raise ValueError(f"{self._subject} (backup #{state.generation}) is not the latest backup{self._of_what} "
                             f"(latest is #{self.generation}{self._why})")
