"""SGLang 0.5.23's rules (sglang 0.5.23 on PyPI; each rule cites the function it follows)."""

from __future__ import annotations

from kvcache.sizing.engine_rules import EngineRules


class SGLangRules(EngineRules):
    """SGLang 0.5.23."""

    name = "sglang"
    title = "SGLang"
    version = "0.5.23"


SGLANG = SGLangRules()
