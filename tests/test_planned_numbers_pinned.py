"""The planned numbers of a few dry runs, pinned: speeding up or refactoring the planner must not move a byte.

The literals below were computed by the planner on main at d1a0df8 (before the planner-speed and
one-home-defaults changes), with `python -m app plan --model ... --json`, and pasted here unchanged:
budget, tokens, running requests, planned bytes and every buffer of the target's arena (the draft's
pool included where a draft runs). Cases cover MHA/GQA, MLA with a NEXTN draft, a huge request cap,
a sliding-window pair (swa_full_tokens_ratio's default), two state hybrids (mamba_full_memory_ratio's
default) and an EAGLE-3 draft.

Moved once on purpose (2026-12-05): request-table rows became SGLang 0.5.23's width, the context plus 4 slots
(plus the draft's tokens), where they had been the context alone; each table grew by its rows x 16 B (page
aligned) and four plans lost 1-23 tokens to it. Nothing else moved.
"""

from __future__ import annotations

import json

import pytest

from app.cli import main

PINNED: list[tuple[tuple[str, ...], tuple[int, int, int, int], dict[str, int]]] = [
    (('Llama-3.1-8B-Instruct', '--gpu', 'H200'),
     (118802840682, 892220, 3485, 118801563648),
     {'req_to_token': 1827723776, 'allocator_index': 28551168, 'kv_full': 116945190912, 'arena_padding': 97792}),
    (('DeepSeek-V3', '--gpu', 'H200', '--tp-size', '8', '--speculative-algorithm', 'NEXTN'),
     (45518810776, 636556, 48, 45518684160),
     {'req_to_token': 32114688, 'allocator_index': 20370432, 'kv_mla': 44732133888, 'arena_padding': 61952, 'kv_draft_mla': 733314048, 'draft_arena_padding': 689152}),
    (('DeepSeek-V3', '--gpu', 'H200', '--tp-size', '8', '--max-running-requests', '100000', '--context-length', '4096'),
     (47181852312, 647781, 100000, 47181725696),
     {'req_to_token': 1640016896, 'allocator_index': 20729856, 'kv_mla': 45520936960, 'arena_padding': 41984}),
    (('gemma-2-9b-it', '--gpu', 'L40S', '--page-size', '16', '--enable-hybrid-swa-memory'),
     (21592255037, 69264, 4096, 21590179840),
     {'req_to_token': 134316544, 'allocator_index': 805376, 'kv_full': 11918376960, 'kv_swa': 9534701568, 'arena_padding': 1979392}),
    (('Qwen3-Next-80B-A3B-Thinking', '--gpu', 'H200', '--tp-size', '4'),
     (94040497455, 3978216, 461, 94040489984),
     {'req_to_token': 484451840, 'allocator_index': 127303680, 'state': 44544393216, 'kv_full': 48884330496, 'arena_padding': 10752}),
    (('Nemotron-H-56B-Base-8K', '--gpu', 'H100-80GB', '--tp-size', '2'),
     (13431607656, 365547, 2, 13430161408),  # the H100's cudaMemGetInfo total, measured 2026-12-06, since then
     {'req_to_token': 98816, 'allocator_index': 11698176, 'state': 5931933696, 'kv_full': 7486423040, 'arena_padding': 7680}),
    (('Llama-3.1-8B-Instruct', '--gpu-memory', '80GiB', '--speculative-algorithm', 'EAGLE3', '--speculative-draft-model', 'EAGLE3-LLaMA3.1-Instruct-8B'),
     (52695479747, 389563, 48, 52695138304),
     {'req_to_token': 25692672, 'allocator_index': 12466176, 'kv_full': 51060932608, 'arena_padding': 114176, 'kv_draft_full': 1595654144, 'draft_arena_padding': 278528}),
]


@pytest.mark.parametrize(("argv", "numbers", "buffers"), PINNED, ids=[" ".join(c[0][:1] + c[0][2:]) for c in PINNED])
def test_the_planned_numbers_are_the_ones_main_planned(argv: tuple[str, ...], numbers: tuple[int, int, int, int],
                                                       buffers: dict[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", *argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["budget_bytes"], got["static_plan_tokens"], got["max_running_requests"], got["planned_bytes"]) == numbers
    assert got["buffers"] == buffers
    assert got["planned_bytes"] == got["allocated_bytes"] == sum(buffers.values())
