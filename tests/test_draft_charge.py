"""SGLang 0.5.23 charges a draft's pool at the target's KV bytes a layer (pool_configurator.py: draft cell =
int(target cell x draft layers / target layers)); its draft worker then allocates the draft's own. The plan holds
SGLang's tokens, builds what SGLang builds and keeps the rest of the budget free, saying so.

Llama-3.1-8B (32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 4,096 B a layer) with Llama-3.2-1B as a STANDALONE
draft (16 layers x 8 x 64 x 2 x 2 B = 2,048 B a layer): charged 131,072 + 16 x 4,096 = 196,608 B a token, held
131,072 + 16 x 2,048 = 163,840.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.cli import main
from kvcache.engines.sglang_draft_charge import sglang_draft_charge

MiB2 = 2 << 20


def _plan(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def test_a_standalone_draft_is_charged_at_the_targets_bytes_a_layer(capsys: pytest.CaptureFixture[str]) -> None:
    report = _plan(capsys, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model", "Llama-3.2-1B-Instruct")
    target, draft = report["plan"]["kv_pools"]
    assert (target["bytes_per_token"], draft["bytes_per_token"]) == (32 * 4096, 16 * 2048)
    assert draft["charged_bytes_per_token"] == 16 * 4096 == 65_536 and target["charged_bytes_per_token"] is None
    assert report["bytes_per_token"] == 163_840  # what the pools hold a token
    tokens, budget = report["static_plan_tokens"], report["budget_bytes"]
    # by hand: the largest T whose arenas (2 MiB multiples of 512-B slots) and the draft's unheld charge fit:
    #   target arena: (T + 1) x 131,072 + the request table (48 + 1 rows of 131,072 + 4 + 4 int32) + two free logs
    #                 of 16 B a token; draft arena: (T + 1) x 32,768; unheld: T x (65,536 - 32,768)
    table = _align(49 * (131_072 + 4 + 4) * 4, 512)
    assert table == report["buffers"]["req_to_token"] == 25_692_160

    def cost(t: int) -> int:
        target_arena = _align((t + 1) * 131_072 + table + 2 * _align(16 * t, 512), MiB2)
        return target_arena + _align((t + 1) * 32_768, MiB2) + t * 32_768

    assert cost(tokens) <= budget < cost(tokens + 1)
    # SGLang's own count is budget // 196,608 = 261,398: the plan's is 187 fewer, as it also charges the request
    # table and the allocator's lists (34 MB; SGLang takes them from its headroom); at 163,840 B a token the budget
    # held 313,678 tokens before, 20% more than SGLang holds (the H100's measured cudaMemGetInfo total)
    assert budget // 196_608 == 261_398 and tokens == 261_211
    # what the draft pool leaves unused: T x 32,768, kept out of what the plan allocates
    assert report["planned_bytes"] + tokens * 32_768 <= budget
    note = next(n for n in report["engine_notes"] if "charges the draft's pool" in n)
    assert "16 layers x 4,096 = 65,536 B a token" in note and "(32,768 B a token)" in note
    assert f"({tokens * 32_768:,} B) of the KV budget stay unused at these {tokens:,} tokens" in note


@pytest.mark.parametrize(("target", "draft", "charged"), [
    ((32, 131_072), (16, 32_768), 65_536),  # Llama-3.2-1B under Llama-3.1-8B: charged more than it holds
    ((32, 131_072), (1, 4_096), None),  # an EAGLE3 head with the target's heads: charged what it holds
    ((61, 61 * 1_152), (1, 1_152), None),  # DeepSeek-V3's NEXTN layer (MLA, the target's own)
    ((28, 28 * 4_096), (16, 16 * 8_192), None),  # a draft wider a layer than the target: never charged less
])
def test_sglangs_proportional_draft_charge(target: tuple[int, int], draft: tuple[int, int], charged: int | None) -> None:
    assert sglang_draft_charge(target=target, draft=draft, kinds=("full", "full")) == charged


def test_pools_sglang_sizes_otherwise_are_charged_what_they_hold() -> None:
    assert sglang_draft_charge(target=(32, 131_072), draft=(16, 32_768), kinds=("full", "swa")) is None


def test_an_eagle3_draft_leaves_nothing_unused(capsys: pytest.CaptureFixture[str]) -> None:
    report = _plan(capsys, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B")
    assert all(p["charged_bytes_per_token"] is None for p in report["plan"]["kv_pools"])
    assert not any("charges the draft's pool" in n for n in report["engine_notes"])
