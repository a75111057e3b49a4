"""A derived mem_fraction_static follows the card size the ranks agreed on, like the budget it scales: nvidia-smi's
total of the smallest card (SGLang keeps the smallest GPU's), beside cudaMemGetInfo's, which the budget reads."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache.inputs.cards import card_named
from kvcache.inputs.rank_agreement import RankAgreement


def test_the_derived_fraction_uses_the_ranks_smallest_card(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    h100 = card_named("H100-80GB")
    alone = RankAgreement.gather_int64

    def two_ranks(self: RankAgreement, values: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        (mine,) = alone(self, values)
        if len(mine) != 4:  # only agree_on_memory's (free before, free after, total, nvidia-smi's) gets a second rank
            return (mine,)
        return (mine, (mine[0], mine[1], h100.total_bytes, h100.device_capacity_bytes))  # same free, a smaller card

    monkeypatch.setattr(RankAgreement, "gather_int64", two_ranks)
    engine = make_engine(model="Llama-3.1-8B-Instruct", card=card_named("H200"), device="meta")
    runner = engine.engine()
    runner.bootstrap()
    configurator = engine.target.configurator()
    plan = runner.target.memory_pool_config
    assert plan.budget.total_bytes == h100.total_bytes and plan.budget.device_capacity_bytes == h100.device_capacity_bytes
    assert plan.budget.mem_fraction_static == configurator.sizing.mem_fraction_static(h100.device_capacity_bytes)
    here = configurator.sizing.mem_fraction_static(configurator.memory_probe.device_capacity_bytes())
    assert plan.budget.mem_fraction_static != here  # 0.830 vs 0.903
