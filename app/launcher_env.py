"""What torchrun tells the processes it starts, read from their environment without torch (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_PORT: the launcher's rendezvous protocol), so a command can ask whether it was launched so
before deciding to import the distributed machinery (app.parallel_setup)."""

from __future__ import annotations

from typing import Mapping

from kvcache.errors import ConfigError


def launcher_int(environ: Mapping[str, str], name: str, default: int) -> int:
    """An integer torchrun sets in the environment (`default` when it is unset)."""
    value = environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} from the launcher is not a number") from None


def launched_world_size(environ: Mapping[str, str]) -> int:
    """The world size torchrun announced (1 when not launched by it)."""
    return launcher_int(environ, "WORLD_SIZE", 1)
