"""The engines a plan can be for, by their --engine name."""

from __future__ import annotations

import typing
from typing import Mapping

from kvcache.sizing.engine_rules import EngineRules
from kvcache.engines.sglang import SGLANG
from kvcache.engines.vllm import VLLM
from kvcache.errors import ConfigError
from kvcache.inputs.server_arg_types import EngineName

# None: the name is accepted by --engine but its rules have not landed yet.
ENGINES: Mapping[str, EngineRules | None] = {"sglang": SGLANG, "vllm": VLLM}
assert set(ENGINES) == set(typing.get_args(EngineName)), "every --engine choice has an entry"


def engine_rules(name: str) -> EngineRules:
    """The rules --engine NAME selects; ConfigError (exit 2) for one not available yet."""
    rules = ENGINES.get(name)
    if rules is None:
        ready = ", ".join(n for n, r in ENGINES.items() if r is not None)
        raise ConfigError(f"--engine {name}: not available yet; use --engine {ready}")
    return rules
