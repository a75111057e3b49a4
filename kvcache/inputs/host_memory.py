"""How much memory this host has, for refusing a --memory-limit it cannot give a CPU engine."""

from __future__ import annotations

import os
from pathlib import Path

from kvcache.byte_units import MiB, format_bytes
from kvcache.errors import ConfigError

CGROUP_LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def host_memory_bytes() -> int | None:
    """Physical memory, lowered to this process's cgroup limit when one is set; None when unknown."""
    sizes: list[int] = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in CGROUP_LIMIT_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            sizes.append(int(text))
    return min(sizes) if sizes else None


def check_memory_limit(limit_bytes: int, host_bytes: int | None) -> None:
    """Refuse a CPU engine's --memory-limit above what the host has (ConfigError naming both)."""
    if host_bytes is not None and limit_bytes > host_bytes:
        raise ConfigError(
            f"--memory-limit {format_bytes(limit_bytes)} is more than this host has ({format_bytes(host_bytes)}); "
            f"use at most --memory-limit {host_bytes // MiB}MiB"
        )
