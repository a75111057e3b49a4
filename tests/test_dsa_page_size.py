"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) is paged at 64, as SGLang 0.5.23 pages it.

SGLang 0.5.23's DeepSeek-family override sets page_size 64 for a config with `index_topk` on CUDA,
whatever --page-size says (a warning, not a refusal). A plan at the flag's page size promised pools
SGLang would not build. Per layer a bf16 DSA token holds (512 + 64) x 2 B of latent and 128 + 4 B
of indexer key: 1,284 B.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import main

CORPUS = Path(__file__).with_name("model_corpus")
DSA = [  # (corpus config, card flags, layers)
    ("DeepSeek-V3.2", ["--gpu", "H200", "--tp-size", "8"], 61),
    ("GLM-5", ["--gpu", "H200", "--tp-size", "16"], 78),
]


def ceil_512(n: int) -> int:
    """A buffer's bytes in the arena: 512-byte slots."""
    return -(-n // 512) * 512


def plan_json(capsys: pytest.CaptureFixture[str], model: str, *flags: str) -> dict[str, Any]:
    assert main(["plan", "--model", model, *flags, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("name", "card", "layers"), DSA)
def test_a_dsa_model_is_planned_at_page_64_and_its_bytes_follow(
        name: str, card: list[str], layers: int, capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(capsys, str(CORPUS / f"{name}.json"), *card)
    tokens, per_token = report["max_total_num_tokens"], report["bytes_per_token"]
    assert report["page_size"] == report["plan"]["page_size"] == 64
    assert per_token == layers * 1_284 and tokens % 64 == 0
    assert report["buffers"]["kv_mla"] == ceil_512((tokens + 64) * per_token)  # tokens + one padding page
    assert report["buffers"]["allocator_index"] == 2 * ceil_512(2 * (tokens // 64) * 8)  # two int64 logs per page
    assert report["page_size_note"] == "DeepSeek sparse attention: SGLang 0.5.23 always pages it at 64"


def test_an_explicit_other_page_size_is_overridden_as_sglang_does_and_the_plan_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    name, card, _ = DSA[0]
    model = str(CORPUS / f"{name}.json")
    default = plan_json(capsys, model, *card)
    asked_16 = plan_json(capsys, model, *card, "--page-size", "16")
    assert asked_16["page_size_note"].endswith("; --page-size 16 overridden")
    assert {k: v for k, v in asked_16.items() if k not in ("page_size_note", "timings_s")} == \
        {k: v for k, v in default.items() if k not in ("page_size_note", "timings_s")}
    assert main(["plan", "--model", model, *card, "--page-size", "16"]) == 0
    assert "page size 64  (DeepSeek sparse attention: SGLang 0.5.23 always pages it at 64; --page-size 16 " \
           "overridden)" in capsys.readouterr().out


def test_a_token_cap_below_one_dsa_page_is_refused_naming_64(capsys: pytest.CaptureFixture[str]) -> None:
    name, card, _ = DSA[0]
    assert main(["plan", "--model", str(CORPUS / f"{name}.json"), *card, "--max-total-tokens", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-total-tokens 32 is below one page (--page-size 64); use at least 64" in err


def test_mla_without_the_sparse_indexer_keeps_the_flags_page_size(capsys: pytest.CaptureFixture[str]) -> None:
    for flags, page in (([], 1), (["--page-size", "16"], 16)):
        report = plan_json(capsys, "DeepSeek-V3", "--gpu", "H200", "--tp-size", "8", *flags)
        assert (report["page_size"], report["page_size_note"]) == (page, None)
