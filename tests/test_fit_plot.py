"""`fit --plot`: the chart file is a real PNG or SVG (with the optional extra), and without it the table still prints."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import app.fit_command as fit_command
from app.cli import main
from app.fit_plot import contexts

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
        # one line per card (L4 and H100-80GB), each a path through the context lengths 1K, 2K, 4K and 8K
        assert len(list(root.iter("{http://www.w3.org/2000/svg}path"))) > 2


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
