"""Caps other than the pool: SGLang 0.5.23's running-request rule, and a report line with the bytes a cap leaves out.

Numbers from issue 22, checked by hand:
- Llama-3.1-8B on an H100 with --max-running-requests 1,000,000: SGLang's rule caps requests at T // 2, and each
  request's table row is 131,072 int32s (512 KiB), so the table takes (69,017 + 1) * 524,288 = 36,185,309,184 B
  and the pool holds 138,035 tokens (69,017 = 138,035 // 2) instead of 405,847 at the default 2,048 requests.
- Nemotron-H-56B at TP 2 on an H200: 80 usable state slots at 5 a request serve 16 requests of 8,192 tokens:
  131,072 of 2,019,610 tokens in use at once; the other 1,888,538 cost 10 attention layers * 4 KV heads a rank *
  (128 + 128) * 2 B = 20,480 B a token: 38,677,258,240 B.
"""

from __future__ import annotations

import json

import pytest

from app.cli import main
from kvcache.sizing.arena_sizes import slot_size


def _plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_huge_request_cap_says_what_the_table_costs(capsys: pytest.CaptureFixture[str]) -> None:
    r = _plan(["--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--max-running-requests", "1000000"], capsys)
    assert r["max_total_num_tokens"] == 136_971 and r["max_running_requests"] == 136_971 // 2 == 68_485
    # rows of SGLang's width: the context and 4 slots, int32, page aligned
    assert r["buffers"]["req_to_token"] == slot_size((68_485 + 1) * (131_072 + 4) * 4) == 35_907_484_160
    (note,) = r["capacity_notes"]
    assert note["cap"] == "request_table" and note["tokens"] == 402_664 - 136_971
    assert "--max-running-requests 1000000 (capped at 68,485" in note["message"] and "(402,664)" in note["message"]


def test_state_slots_that_bind_say_how_much_of_the_pool_running_requests_can_use(
        capsys: pytest.CaptureFixture[str]) -> None:
    r = _plan(["--model", "Nemotron-H-56B-Base-8K", "--gpu", "H200", "--tp-size", "2"], capsys)
    assert r["max_total_num_tokens"] == 2_019_610 and r["max_running_requests"] == 16 and r["bytes_per_token"] == 20_480
    (note,) = r["capacity_notes"]
    assert note == {"cap": "state_slots", "tokens": 1_888_538, "bytes": 38_677_258_240, "message": note["message"],
                    "fixes": []}
    assert "at most 16 x 8,192 = 131,072 tokens are in use at once" in note["message"]


def test_a_small_request_cap_is_named_and_the_default_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _plan(["--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"], capsys)["capacity_notes"] == []
    r = _plan(["--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--max-running-requests", "2"], capsys)
    (note,) = r["capacity_notes"]
    left = r["max_total_num_tokens"] - 2 * 131_072  # the notes read the headline's pools (a measured bootstrap's)
    assert note["cap"] == "max_running_requests" and note["tokens"] == left and note["bytes"] == left * 131_072
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--max-running-requests", "2"]) == 0
    assert "note: --max-running-requests caps running requests at 2: " in capsys.readouterr().out
