"""How the CLI reports a failure: one line on stderr, and one JSON object on stdout with --json.

Every failure maps to one `Failure`: bad input (exit 2), does not fit (exit 3), another rank lost
mid-start (exit 4: it failed or was killed, and says why itself), or an internal error, which is a bug in
this program (exit 1). Nothing here prints a traceback.
"""

from __future__ import annotations

import msgspec

from kvcache.byte_units import format_bytes
from kvcache.errors import ConfigError, DoesNotFitError, PoolOutOfMemoryError, RankLostError
from kvcache.memory.out_of_memory import is_out_of_memory

EXIT_BUG, EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_RANK_LOST = 1, 2, 3, 4


class UsageError(ConfigError):
    """The command line itself is malformed (argparse refused it)."""


class OutputUnwritableError(ConfigError):
    """The report could not be written (a full disk, a lost device): the setup's fault, not a bug (exit 2)."""


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """One failure as scripts read it from --json: `{"error": {...}}`."""

    kind: str  # "bad_input" | "does_not_fit" | "rank_lost" | "internal_error"
    message: str  # one line
    exit_code: int
    suggestions: list[str] = []
    needed_bytes: int | None = None
    available_bytes: int | None = None

    def line(self) -> str:
        """The one line for stderr."""
        label = {"bad_input": "error", "does_not_fit": "does not fit", "rank_lost": "rank lost",
                 "internal_error": "internal error"}[self.kind]
        fixes = f"; what would work: {'; '.join(self.suggestions)}" if self.suggestions else ""
        return f"kvcache: {label}: {self.message}{fixes}"

    def json(self) -> str:
        return msgspec.json.encode({"error": self}).decode()


def one_line(text: str) -> str:
    """A possibly multi-line message as one line (lines joined by '; ')."""
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def failure_of(exc: BaseException) -> Failure:
    """The report for any exception: typed errors keep their numbers, anything else is a bug."""
    if isinstance(exc, DoesNotFitError):
        return Failure(
            kind="does_not_fit", exit_code=EXIT_DOES_NOT_FIT, suggestions=list(exc.suggestions),
            message=f"{one_line(exc.what)} (needed {format_bytes(exc.needed_bytes)}, "
                    f"available {format_bytes(exc.available_bytes)})",
            needed_bytes=exc.needed_bytes, available_bytes=exc.available_bytes,
        )
    # only the device refusing memory; a PoolBuildError that is not one is a broken invariant: a bug (exit 1)
    if isinstance(exc, PoolOutOfMemoryError) or is_out_of_memory(exc):
        what = one_line(str(exc)) or type(exc).__name__
        return Failure(kind="does_not_fit", exit_code=EXIT_DOES_NOT_FIT, message=f"out of memory: {what}")
    if isinstance(exc, RankLostError):  # another rank failed or died: its own output says why (exit 4)
        return Failure(kind="rank_lost", exit_code=EXIT_RANK_LOST, message=one_line(str(exc)))
    if isinstance(exc, (ConfigError, msgspec.ValidationError, msgspec.DecodeError)):
        return Failure(kind="bad_input", exit_code=EXIT_BAD_INPUT, message=one_line(str(exc)))
    detail = one_line(str(exc))
    return Failure(
        kind="internal_error", exit_code=EXIT_BUG,
        message=f"{type(exc).__name__}{': ' + detail if detail else ''} (a bug in kvcache, not in your input; "
                "please report it with the command line)",
    )
