"""`fit`'s own inputs, hostile: digits of other scripts in its list options, a --plot path into a folder that is
not there, a --config settings file that sets the fields fit sweeps. Each is bad input (exit 2, one line naming
the flag or the file's key) or is honoured as the flags would be; none is an internal error or silently dropped.
Drawn by Hypothesis, derandomized, few examples (each runs the whole command, about 0.05 s)."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from msgspec import inspect as mi

from app.cli import main
from app.server_args_flags import server_args_fields
from kvcache.errors import ConfigError
from kvcache.inputs.server_args import ServerArgs

FEW = settings(max_examples=10, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SWEEP = ["fit", "--model", "Qwen3-8B", "--requests", "8", "--context-length", "4096", "--gpu", "L4,H200"]
KV_DTYPES = ["auto", "bfloat16", "fp8_e4m3", "fp8_e5m2"]


def answer(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one in-process run; never an internal error, at most one stderr line."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 2, 3) and "internal error" not in err and err.count("\n") <= 1, (argv, err)
    return code, out, err


def space(out: str) -> dict[str, Any]:
    """The sweep's space from `fit --json`."""
    return json.loads(out)["space"]


# ---- digits of other scripts in the list options --------------------------------------------------------------

NON_ASCII_DIGITS = st.characters(categories=["Nd", "No"]).filter(lambda c: not c.isascii())


@FEW
@given(digit=NON_ASCII_DIGITS, flag=st.sampled_from(["--tp-size", "--pp-size"]), at=st.integers(0, 1))
def test_a_digit_of_another_script_is_read_as_int_reads_it_or_refused_naming_the_flag(
        digit: str, flag: str, at: int, capsys: pytest.CaptureFixture[str]) -> None:
    items = ["1", "1"]
    items[at] = digit
    code, out, err = answer([*SWEEP, "--kv-cache-dtype", "auto", flag, ",".join(items), "--json"], capsys)
    value = unicodedata.decimal(digit, None)  # what int() makes of it: a decimal digit of any script, or nothing
    if value is None or value < 1:
        assert code == 2 and err.startswith(f"kvcache: error: {flag} ") and "positive integer" in err, err
    else:  # as `plan --tp-size ٢` reads it: the same sweep as the ASCII digit
        key = "tp_sizes" if flag == "--tp-size" else "pp_sizes"
        assert space(out)[key] == list(dict.fromkeys([int(i) if i.isascii() else value for i in items]))


def test_a_superscript_two_is_refused_not_an_internal_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = answer([*SWEEP, "--tp-size", "\u00b2,2"], capsys)  # '²'.isdigit() is True, int('²') fails
    assert code == 2 and err == ("kvcache: error: --tp-size '\u00b2,2': '\u00b2' is not a positive integer; "
                                 "e.g. --tp-size 1,2,4,8\n")


# ---- --plot into a folder that is not there ---------------------------------------------------------------------

SEGMENTS = st.text(st.characters(categories=["L", "N"], max_codepoint=0x2FF), min_size=1, max_size=8)


@FEW
@given(folders=st.lists(SEGMENTS, min_size=1, max_size=3), suffix=st.sampled_from(["png", "svg"]))
def test_a_chart_into_a_missing_folder_is_refused_before_the_sweep(
        folders: list[str], suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path.joinpath("missing", *folders, f"fit.{suffix}")
    code, out, err = answer([*SWEEP, "--plot", str(chart)], capsys)
    assert code == 2 and out == "" and err == (
        f"kvcache: error: --plot {chart}: the folder {chart.parent} does not exist; create it first or give a path "
        "in an existing folder (e.g. --plot fit.png)\n")


def test_a_chart_under_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes").write_text("")
    code, _, err = answer([*SWEEP, "--plot", str(tmp_path / "notes" / "fit.png")], capsys)
    assert code == 2 and f"the folder {tmp_path / 'notes'} is not a folder" in err


# ---- a settings file that sets what fit sweeps ------------------------------------------------------------------

GOOD = {"tp_size": st.sampled_from([1, 2, 4]), "pp_size": st.sampled_from([1, 2]),
        "kv_cache_dtype": st.sampled_from(KV_DTYPES)}
BAD = {"tp_size": st.sampled_from([0, -1, "two", 1.5, [1, 2]]), "pp_size": st.sampled_from([0, -3, "x", 2.0]),
       "kv_cache_dtype": st.sampled_from(["nonsense", "fp8", "int4", 8, ""])}
SPELLINGS = {"tp_size": ["tp_size", "tp-size", "tensor_parallel_size"],
             "pp_size": ["pp_size", "pp-size", "pipeline_parallel_size"],
             "kv_cache_dtype": ["kv_cache_dtype", "kv-cache-dtype"]}


@st.composite
def swept_settings(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """(the file's values by field, the key each is written under, the first field with a bad value or None)."""
    fields = draw(st.lists(st.sampled_from(sorted(GOOD)), min_size=1, max_size=3, unique=True))
    bad = draw(st.none() | st.sampled_from(fields))
    values = {f: draw(BAD[f] if f == bad else GOOD[f]) for f in fields}
    return values, {f: draw(st.sampled_from(SPELLINGS[f])) for f in fields}, bad


@FEW
@given(case=swept_settings(), as_toml=st.booleans())
def test_a_settings_file_restricts_the_sweep_or_is_refused_naming_its_key(
        case: tuple[dict[str, Any], dict[str, str], str | None], as_toml: bool, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    values, keys, bad = case
    path = tmp_path / ("s.toml" if as_toml else "s.json")
    if as_toml:
        path.write_text("".join(f"{keys[f]} = {json.dumps(v)}\n" for f, v in values.items()))
    else:
        path.write_text(json.dumps({keys[f]: v for f, v in values.items()}))
    code, out, err = answer([*SWEEP, "--config", str(path), "--json"], capsys)
    if bad is not None:
        flag = bad.replace("_", "-")
        assert code == 2 and err.startswith(f"kvcache: error: config file {path}: {flag} = ") and \
            f"(--{flag}, ServerArgs.{bad})" in err, err
        return
    swept, defaults = space(out), {"tp_size": [1, 2, 4, 8], "pp_size": [1], "kv_cache_dtype": ["auto", "fp8_e4m3"]}
    for field, key in (("tp_size", "tp_sizes"), ("pp_size", "pp_sizes"), ("kv_cache_dtype", "kv_cache_dtypes")):
        assert swept[key] == ([values[field]] if field in values else defaults[field]), (field, swept)


def test_a_flag_overrides_the_files_swept_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text('tp-size = 2\nkv-cache-dtype = "fp8_e5m2"\n')
    code, out, _ = answer([*SWEEP, "--config", str(path), "--tp-size", "1,4", "--json"], capsys)
    assert code == 0 and space(out)["tp_sizes"] == [1, 4] and space(out)["kv_cache_dtypes"] == ["fp8_e5m2"]


def test_a_files_other_bad_value_is_refused_before_the_sweep_in_the_files_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text("page-size = 0\n")
    code, out, err = answer([*SWEEP, "--config", str(path)], capsys)
    assert code == 2 and out == "" and err == (f"kvcache: error: config file {path}: page-size = 0 is refused "
                                               "(--page-size, ServerArgs.page_size): expected int >= 1\n")


# ---- a sweep where nothing fits names a value that does, and that value, run again, fits -------------------------

def replanned(argv: list[str], fix: str) -> list[str]:
    """`argv` with the flags of the suggestion `fix` ('--gpu H200 --tp-size 8 (...)') in place of its own."""
    flags = re.findall(r"(--[a-z-]+) (\S+)", fix.split(" (")[0])
    named = {flag for flag, _ in flags}
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in named:
            skip = True
            continue
        out.append(arg)
    return out + [part for pair in flags for part in pair]


@settings(FEW, max_examples=6)
@given(model=st.sampled_from(["SmolLM2-135M", "Qwen3-8B"]), card=st.sampled_from(["L4", "A10", "H100-80GB"]),
       requests=st.sampled_from([64, 4_096, 10**6]), context=st.sampled_from([4_096, 8_192]),
       cap=st.none() | st.sampled_from([1, 8]))
def test_a_sweep_that_fits_nowhere_names_a_value_that_fits(model: str, card: str, requests: int, context: int,
                                                           cap: int | None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fit", "--model", model, "--gpu", card, "--tp-size", "1", "--kv-cache-dtype", "auto",
            "--requests", str(requests), "--context-length", str(context)]
    argv += [] if cap is None else ["--max-running-requests", str(cap)]
    code, _, err = answer(argv, capsys)
    if code == 0:
        return
    assert code == 3 and "what would work: " in err and "more or larger cards" not in err, err
    fix = err.split("what would work: ")[1].split("; ")[0]
    event(fix.split(" (")[0].split(" ")[0])  # which kind of fix (--statistics shows each was drawn)
    if cap is not None and cap < requests and fix.startswith("--max-running-requests"):
        assert fix.startswith(f"--max-running-requests {requests} ")  # the cap, lifted to the target, not more cards
    assert answer(replanned(argv, fix), capsys)[0] == 0, fix


# ---- a settings file with any of ServerArgs' fields, valid or not ----------------------------------------------

def _field_values(kind: mi.Type) -> st.SearchStrategy[Any]:
    """Values of a field's type at and past its edges, and of the wrong type."""
    wrong = st.sampled_from(["x", None, [1]])
    if isinstance(kind, mi.LiteralType):
        return st.sampled_from(list(kind.values)) | st.just("bogus")
    if isinstance(kind, mi.BoolType):
        return st.booleans() | st.just("yes")
    if isinstance(kind, mi.IntType):
        return st.sampled_from([0, 1, 2, 8, 64, 4096, 10**9]) | wrong
    if isinstance(kind, mi.FloatType):
        return st.sampled_from([0.0, 0.3, 0.9, 1.0, 1.5]) | wrong
    return st.sampled_from(["SmolLM2-135M", "no-such-model"]) | wrong


FIELDS = {f.field: _field_values(f.kind) for f in server_args_fields()}


@settings(FEW, max_examples=12)
@given(values=st.dictionaries(st.sampled_from(sorted(FIELDS)), st.none(), min_size=1, max_size=4).flatmap(
    lambda picked: st.fixed_dictionaries({name: FIELDS[name] for name in picked})))
def test_a_settings_file_with_any_fields_is_honoured_or_refused_naming_the_file(
        values: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(values))
    code, out, err = answer([*SWEEP, "--config", str(path), "--json"], capsys)
    event(f"exit {code}")
    try:
        ServerArgs.from_mapping({**values, "device": "meta"})
    except ConfigError as exc:
        field = re.search(r" - at `\$\.(\w+)`", str(exc))
        assert code == 2, (values, err)  # nothing a file gets wrong is dropped
        if field is not None and field.group(1) != "device":  # one field's value: named as the file writes it
            assert f"config file {path}: {field.group(1).replace('_', '-')} = " in err, (values, err)
        return
    if code != 2:  # a valid file plans, its swept values as the sweep's only ones
        swept = space(out)
        for name, key in (("tp_size", "tp_sizes"), ("pp_size", "pp_sizes"), ("kv_cache_dtype", "kv_cache_dtypes")):
            assert name not in values or swept[key] == [values[name]], (values, swept)
