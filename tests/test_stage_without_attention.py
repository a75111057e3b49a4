"""A pipeline stage of a hybrid with recurrent state but no attention layer is refused in one line, exit 2.

Bamba-9B's 32 layers have attention at 9, 18 and 27 only; at --pp-size 4 stage 0 holds layers 0-7,
all Mamba-2. Its plan went through, then building the stage's pools failed as "does not fit: out of
memory: expected one attention pool, got []" (exit 3), which names neither the cause nor a fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main

BAMBA = Path(__file__).with_name("model_corpus") / "Bamba-9B.json"


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err


def test_a_stage_without_attention_names_the_pp_sizes_whose_stages_all_have_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    # --pp-size 2: layers 0-15 (attention 9) and 16-31 (18, 27); 3: 0-10, 11-21, 22-31; 4: 0-7 has none
    err = _error(["plan", "--model", str(BAMBA), "--gpu", "A100-40GB", "--pp-size", "4"], capsys)
    assert "pipeline stage 0 of --pp-size 4 (layers 0-7) has no attention layer" in err
    assert err.rstrip().endswith("use --pp-size 1, 2 or 3")
    assert main(["plan", "--model", str(BAMBA), "--gpu", "A100-40GB", "--pp-size", "3"]) == 0


def test_a_model_without_attention_plans_its_state_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every stage of a pure state-space model lacks attention, as the whole model does: it plans (state slots and
    a token pool of no bytes, tests/test_pure_ssm.py), at any --pp-size."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(BAMBA.read_text()) | {"attn_layer_indices": []}))
    assert main(["plan", "--model", str(path), "--gpu", "H200", "--pp-size", "4"]) == 0
    assert "no per-token KV" in capsys.readouterr().out
