"""Properties of `plan --engine vllm`'s two bad-input classes: vLLM's scheduler minimum (max_num_batched_tokens at least
max_num_seqs, vLLM 0.34.0's SchedulerConfig) at and past its edge, and every SGLang-only knob given under vLLM's rules.
Each answer is a plan, or exit 2 with one line naming the flag and, where vLLM has it, vLLM's flag or a value that
starts (re-run here). Drawn by Hypothesis, derandomized, few examples (each runs the command in-process)."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import inspect as mi

from app.cli import main
from app.server_args_flags import server_args_fields
from kvcache.inputs.engine_knobs import VLLM_READS
from kvcache.inputs.other_engines_flags import VLLM_COUNTERPARTS
from kvcache.inputs.server_args import ServerArgs

QUICK = settings(max_examples=10, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PLAN = ["plan", "--model", "SmolLM2-135M", "--gpu", "H200", "--engine", "vllm", "--max-model-len", "2048"]
DEFAULT_SEQS = 1024  # vLLM's max_num_seqs on a card of 70 GiB or more


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@QUICK
@given(seqs=st.one_of(st.none(), st.integers(1, 4096)), batched=st.one_of(st.none(), st.integers(1, 4096)))
def test_the_scheduler_minimum_is_vllms_and_its_fixes_start(seqs: int | None, batched: int | None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    flags = (["--max-num-seqs", str(seqs)] if seqs else []) + (["--max-num-batched-tokens", str(batched)] if batched else [])
    code, err = run([*PLAN, *flags], capsys)
    # unset, max_num_batched_tokens is the card's 8,192 capped at max_num_seqs x 2,048 (never below max_num_seqs)
    refused = batched is not None and batched < (seqs or DEFAULT_SEQS)
    assert code == (2 if refused else 0), err
    if refused:
        assert err.count("\n") == 1 and "SchedulerConfig refuses it" in err
        fixes = re.search(r"use --max-num-batched-tokens (\d+) or --max-num-seqs (\d+)$", err.strip())
        assert fixes is not None and int(fixes.group(1)) == (seqs or DEFAULT_SEQS) and int(fixes.group(2)) == batched
        seqs_flag = ["--max-num-seqs", str(seqs)] if seqs else []
        assert run([*PLAN, *seqs_flag, "--max-num-batched-tokens", fixes.group(1)], capsys)[0] == 0
        assert run([*PLAN, "--max-num-batched-tokens", str(batched), "--max-num-seqs", fixes.group(2)], capsys)[0] == 0


def _non_default_argv(field: str) -> list[str] | None:
    """A command line giving `field` a valid value other than its default, or None (no flag value of that kind)."""
    f = next(f for f in server_args_fields() if f.field == field)
    if isinstance(f.kind, mi.BoolType):
        return [f.flag] if f.default is not True else None
    if isinstance(f.kind, mi.LiteralType):
        other = [str(c) for c in f.kind.values if c != f.default]
        return [f.flag, other[0]] if other else None
    if isinstance(f.kind, mi.FloatType):
        return [f.flag, "0.5" if f.default != 0.5 else "0.25"]
    if isinstance(f.kind, mi.IntType):
        return [f.flag, "7" if f.default != 7 else "8"]
    return [f.flag, "x"] if isinstance(f.kind, mi.StrType) else None


SGLANG_ONLY = sorted(f for f in ServerArgs.__struct_fields__ if f not in VLLM_READS and _non_default_argv(f) is not None)


@settings(QUICK, max_examples=20)
@given(fields=st.lists(st.sampled_from(SGLANG_ONLY), min_size=1, max_size=3, unique=True))
def test_every_sglang_knob_under_vllm_is_refused_naming_vllms(fields: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = [part for f in fields for part in (_non_default_argv(f) or [])]
    code, err = run([*PLAN, *argv], capsys)
    assert code == 2 and err.count("\n") == 1 and "under --engine vllm:" in err, err
    for f in fields:
        said = f"--{f.replace('_', '-')} ("
        assert said in err
        assert ("use --" in err or "drop it" in err) and (VLLM_COUNTERPARTS.get(f, "drop it") in err)
    assert len(SGLANG_ONLY) >= 25  # every SGLang knob: memory, pools, graphs, hybrids, multimodal, speculative
