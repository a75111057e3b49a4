"""Engine rules: what one engine version decides about the KV cache, chosen by one field (`--engine`).

Which layers get a pool of their own, how the budget is split and what is kept back are the rules of
one engine version (SGLang 0.5.23 today), written here as data plus small functions, each citing the
code it follows. The planner, pools and allocators stay one: the configurator hands the chosen
rules to `WorkerSizing`, which asks them (`kvcache.sizing.engine_rules` holds the base class).

Floor: above `runtime`, below the configurator (rules may read models, memory and sizing; nothing
below imports this package).
"""

from kvcache.engines.registry import ENGINES, engine_rules
from kvcache.sizing.engine_rules import EngineRules

__all__ = ["ENGINES", "EngineRules", "engine_rules"]
