"""`fit --plot`: the chart file is a real PNG or SVG (with the optional extra), and without it the table still prints."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import app.fit_command as fit_command
from app.cli import main
from app.fit_plot import contexts, left_out, lines_to_draw, merged
from app.fit_sweep import FitRow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SWEEP = ["fit", "--model", "SmolLM2-135M", "--gpu", "L4,H100-80GB", "--tp-size", "1", "--kv-cache-dtype", "auto",
         "--requests", "64", "--context-length", "4096"]
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")


@needs_matplotlib
@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_the_chart_is_a_valid_file(suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path / f"fit.{suffix}"
    assert main([*SWEEP, "--plot", str(chart)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"chart: {chart}")
    data = chart.read_bytes()
    if suffix == "png":
        assert data.startswith(PNG_MAGIC)
    else:
        root = ET.fromstring(data)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        # a panel per card (L4 and H100-80GB), each a line through the context lengths 1K, 2K, 4K and 8K
        assert len(list(root.iter("{http://www.w3.org/2000/svg}path"))) > 2
        texts = {"".join(t.itertext()).strip() for t in root.iter("{http://www.w3.org/2000/svg}text")}
        assert {"L4", "H100-80GB"} <= texts and any(t.startswith("TP1 bfloat16") for t in texts)


def test_without_matplotlib_the_table_prints_and_the_line_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(fit_command, "have_matplotlib", lambda: False)
    chart = tmp_path / "fit.png"
    assert main([*SWEEP, "--plot", str(chart)]) == 2
    out, err = capsys.readouterr()
    assert "* cheapest (fewest GPUs, then the least headroom over the target): 1 x L4" in out and not chart.exists()
    assert err == ("kvcache: error: --plot needs matplotlib, an optional extra: pip install "
                   "'kvcache-configurator[plot]' (or pip install matplotlib)\n")


def test_the_chart_plans_powers_of_two_up_to_the_models_context() -> None:
    assert contexts(16384, 131072) == [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    assert contexts(3000, 5000) == [1024, 2048, 3000, 4096, 5000]


def _row(card: str, tp: int, outcome: str, dtype: str = "auto") -> FitRow:
    return FitRow(card=card, card_bytes=1, tp_size=tp, pp_size=1, gpus=tp, kv_cache_dtype=dtype,
                  kv_cache_dtype_resolved="bfloat16", fits=outcome == "fits", outcome=outcome,  # type: ignore[arg-type]
                  why_not="", needed_bytes=None, available_bytes=None, weights_bytes=1, budget_bytes=1,
                  max_total_tokens=1, static_plan_tokens=1, tokens_source="static_plan", max_running_requests=1,
                  context_length=1, requests_at_context=1, headroom=1.0)


def test_every_pair_that_plans_is_drawn_and_the_rest_are_named() -> None:
    """The chart drew the first 6 card/TP pairs and dropped the rest without a word (a 70B's H100-94GB, B200 and
    MI300X at TP 8); now every row that plans has a line, and the pairs none of whose cells plan are named."""
    rows = [_row(f"card{i}", tp, "fits") for i in range(4) for tp in (4, 8)]
    rows += [_row("L4", 1, "weights"), _row("L4", 1, "weights", "fp8_e4m3"), _row("L4", 2, "one_request"),
             _row("A10", 8, "target"), _row("A10", 8, "invalid", "fp8_e4m3")]
    assert lines_to_draw(rows) == [r for r in rows if r.outcome in ("fits", "target")]  # 9 pairs, none dropped
    assert left_out(rows) == ("not drawn (no KV dtype plans: the weights, one request or the layout): L4 TP1, TP2")
    assert left_out(rows[:8]) == ""


def test_lines_with_the_same_points_are_drawn_once_with_both_labels() -> None:
    same, other = ((1024, 64), (2048, 32)), ((1024, 64), (2048, 31))
    assert merged([("TP4 bfloat16", same), ("TP8 bfloat16", same), ("TP8 fp8_e4m3", other)]) == [
        ("TP4 bfloat16 = TP8 bfloat16", same), ("TP8 fp8_e4m3", other)]
