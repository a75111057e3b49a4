"""Where the reference engines' sources (SGLang 0.5.23's sglang/, vLLM 0.34.0's vllm/) lie on this machine.

They are not dependencies: a developer unpacks them by hand (`pip download --no-deps`, then unzip) and names
the folder with KVCACHE_REFERENCE_SRC or a benchmark's --reference-src. It selects what to compare against;
no number of the project's changes with it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REFERENCE_SRC_ENV = "KVCACHE_REFERENCE_SRC"


def reference_src_from_env() -> Path | None:
    """The folder KVCACHE_REFERENCE_SRC names, or None when it is unset or empty."""
    value = os.environ.get(REFERENCE_SRC_ENV, "")
    return Path(value) if value else None


def add_reference_src_argument(parser: argparse.ArgumentParser, holding: str) -> None:
    """--reference-src DIR, defaulting to KVCACHE_REFERENCE_SRC; required when that is unset."""
    default = reference_src_from_env()
    parser.add_argument("--reference-src", type=Path, default=default, required=default is None,
                        help=f"a folder holding {holding} (default: ${REFERENCE_SRC_ENV})")
