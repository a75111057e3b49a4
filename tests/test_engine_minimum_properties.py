"""Values at and past each engine's start-up minimums (kvcache.engines.sglang_minimums), per-layer lists of the wrong
length, and searches for a value to suggest over huge inputs: each is refused in one line naming the flag and a value
that works, and that value, run again, gets past the refusal. Drawn by Hypothesis, derandomized, few examples."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from kvcache.errors import ModelConfigFieldError, UnsupportedModelError
from kvcache.inputs.server_arg_types import MAX_COUNT
from kvcache.models.hf_config import model_config_from_hf
from kvcache.models.presets import PRESET_DIR

FEW = settings(max_examples=8, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CORPUS = Path(__file__).resolve().parent / "model_corpus"
PLAN = ["plan", "--gpu", "H200", "--model", "Qwen3-8B"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, stderr) of one in-process run: 0, 2 or 3, and at most one line on stderr."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 2, 3) and err.count("\n") <= 1 and "internal error" not in err, (argv, err)
    return code, err


def suggested(err: str, flag: str) -> str:
    """The value the line suggests for `flag` (after 'use' or 'what would work:')."""
    found = re.search(rf"(?:use|what would work:) .*?{flag} (\d+)", err)
    assert found, (flag, err)
    return found.group(1)


# ---- SGLang 0.5.23: a request holds at least one token after the reserved one (tp_worker.py) ------------------------

@FEW
@given(context=st.integers(1, 3))
def test_a_context_at_and_past_sglangs_minimum(context: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([*PLAN, "--context-length", str(context)], capsys)
    if context < 2:  # max_req_len = min(1 - 1, pool - 1) = 0: SGLang asserts at start-up
        assert code == 2 and err == ("kvcache: error: --context-length 1 is below the 2 tokens SGLang 0.5.23 starts "
                                     "with; use --context-length 2 or more\n")
        assert run([*PLAN, "--context-length", suggested(err, "--context-length")], capsys)[0] == 0
    else:
        assert code == 0, err


@FEW
@given(tokens=st.integers(1, 3), context=st.sampled_from([None, 2, 4096]))
def test_a_token_cap_at_and_past_sglangs_minimum_pool(tokens: int, context: int | None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    extra = [] if context is None else ["--context-length", str(context)]
    code, err = run([*PLAN, "--max-total-tokens", str(tokens), *extra], capsys)
    if tokens < 2:  # a pool of one token: max_req_len = 0, as above; the fix is a larger cap, not a context of 1
        assert code == 3 and "the KV pool holds 1 token, below the 2 the engine starts with" in err
        assert "--context-length 1 " not in err and "--tp-size" not in err
        fix = suggested(err, "--max-total-tokens")
        assert run([*PLAN, "--max-total-tokens", fix, *extra], capsys)[0] == 0
    else:
        assert code == 0, err


@FEW
@given(steps=st.one_of(st.integers(1, 40), st.integers(MAX_COUNT - 8, MAX_COUNT - 1)),
       context=st.sampled_from([3, 8, 32, 163_840]))
def test_a_draft_step_longer_than_a_request_is_refused_with_a_chain_that_runs(
        steps: int, context: int, capsys: pytest.CaptureFixture[str]) -> None:
    spec = ["--model", "DeepSeek-V3", "--tp-size", "8", "--speculative-algorithm", "NEXTN"]
    code, err = run(["plan", "--gpu", "H200", *spec, "--speculative-num-steps", str(steps),
                     "--context-length", str(context)], capsys)
    if steps + 1 < context:  # a chain of steps verifies steps + 1 tokens, which a request of the context holds
        assert code == 0, err
        return
    assert code == 2 and f"allocates {steps + 1:,} KV slots per request" in err, err
    if context > 4:  # SGLang's default chain (3 steps, 4 tokens) fits: suggested, and it plans
        assert err.endswith("use --speculative-num-steps 3 --speculative-num-draft-tokens 4 (SGLang's default chain)\n")
        fix = ["--speculative-num-steps", "3", "--context-length", str(context)]
    else:
        fix = ["--speculative-num-steps", str(steps), "--context-length", suggested(err, "--context-length")]
    assert run(["plan", "--gpu", "H200", *spec, *fix], capsys)[0] == 0


@FEW
@given(page=st.sampled_from([16, 64, 100, 256]), chunk=st.integers(1, 20_000))
def test_a_prefill_chunk_the_page_does_not_divide_is_refused_with_one_it_does(
        page: int, chunk: int, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*PLAN, "--page-size", str(page)]
    code, err = run([*args, "--chunked-prefill-size", str(chunk)], capsys)
    if chunk % page == 0:  # validation_hook.py: assert chunked_prefill_size % page_size == 0
        assert code == 0, err
        return
    fix = int(suggested(err, "--chunked-prefill-size"))
    assert code == 2 and fix % page == 0 and fix == max(page, chunk - chunk % page), err
    assert run([*args, "--chunked-prefill-size", str(fix)], capsys)[0] == 0


# ---- a suggestion's search is bounded: --dp-size up to 2**31 - 1 ------------------------------------------------

@FEW
@given(tp=st.integers(2, MAX_COUNT), dp=st.integers(2**30, MAX_COUNT))
def test_a_dp_size_that_does_not_divide_tp_is_refused_with_one_that_does(
        tp: int, dp: int, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--tp-size", str(tp), "--enable-dp-attention"]
    code, err = run([*PLAN, *args, "--dp-size", str(dp)], capsys)
    if tp % dp == 0:
        return  # divides: refused or planned for other reasons (no card has 2**31 ranks)
    assert code == 2 and f"--tp-size {tp} must be a multiple of --dp-size {dp}" in err, err
    found = re.search(r"try --dp-size (\d+)", err)
    if found:  # the largest divisor of tp not above dp (found over the divisor pairs up to sqrt(tp))
        fix = int(found.group(1))
        assert tp % fix == 0 and 2 <= fix <= dp
        assert "must be a multiple" not in run([*PLAN, *args, "--dp-size", str(fix)], capsys)[1]


# ---- a per-layer list one entry short or long (transformers refuses it) ----------------------------------------

def _per_layer_lists() -> list[tuple[str, str | None, str]]:
    """(file, section, key) of every shipped or corpus config that loads and whose per-layer list sits beside a
    layer count."""
    out = []
    for path in sorted([*PRESET_DIR.glob("*.json"), *CORPUS.glob("*.json")]):
        hf = json.loads(path.read_text())
        try:
            model_config_from_hf(hf, name="m")
        except UnsupportedModelError:  # an architecture refused as a whole (Gemma-4): nothing to spoil
            continue
        for section in (None, "text_config"):
            d = hf if section is None else hf.get(section)
            if isinstance(d, dict) and "num_hidden_layers" in d:
                out += [(str(path), section, key) for key in ("layer_types", "layers_block_type", "mlp_layer_types")
                        if isinstance(d.get(key), list) and len(d[key]) > 1]
    return out


PER_LAYER = _per_layer_lists()


def test_the_corpus_has_per_layer_lists_to_spoil() -> None:
    assert len(PER_LAYER) >= 5 and any("Llama-4" in f for f, _, _ in PER_LAYER)


@pytest.mark.parametrize("change", [-1, 1])
@pytest.mark.parametrize("case", PER_LAYER, ids=lambda c: f"{Path(c[0]).stem}:{c[2]}")
def test_a_per_layer_list_of_the_wrong_length_is_refused(case: tuple[str, str | None, str], change: int) -> None:
    path, section, key = case
    hf: dict[str, Any] = json.loads(Path(path).read_text())
    spoiled = copy.deepcopy(hf)
    d = spoiled if section is None else spoiled[section]
    d[key] = d[key][:-1] if change < 0 else d[key] + d[key][-1:]
    with pytest.raises(ModelConfigFieldError) as info:
        model_config_from_hf(spoiled, name="m")
    where = key if section is None else f"{section}.{key}"
    assert f"field '{where}' is 'a list of {len(d[key])}'" in str(info.value), str(info.value)


# ---- refusals name a value of the knob that failed, and that value plans ---------------------------------------

@FEW
@given(page=st.one_of(st.integers(8193, MAX_COUNT), st.sampled_from([100, 2**19, 10**6, 10**8])))
def test_a_page_that_does_not_divide_the_cards_default_chunk_names_one_that_does(
        page: int, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang 0.5.23 asserts chunked_prefill_size % page_size == 0 at start-up (validation_hook.py), and with no
    --chunked-prefill-size the chunk is the card's default: 8,192 on an H200 (143,771 MiB, below 160 GiB). So a page
    that does not divide 8,192 is refused, naming the largest page that does (64 for 100, 8,192 past it), which plans."""
    code, err = run([*PLAN, "--page-size", str(page)], capsys)
    fit = 64 if page == 100 else 8192
    assert code == 2 and "default --chunked-prefill-size on this card (8,192)" in err and \
        f"use --page-size {fit}" in err, err
    assert run([*PLAN, "--page-size", suggested(err, "--page-size")], capsys)[0] == 0


@FEW
@given(utilization=st.floats(0.001, 0.246), block=st.none() | st.sampled_from([16, 1024]))
def test_a_vllm_utilization_too_low_to_start_names_one_that_starts(utilization: float, block: int | None,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    args = [*PLAN, "--engine", "vllm", *([] if block is None else ["--block-size", str(block)])]
    code, err = run([*args, "--gpu-memory-utilization", repr(utilization)], capsys)
    assert code == 3 and "vLLM 0.34.0 would refuse to start" in err, err
    fix = re.search(r"--gpu-memory-utilization (0\.\d+) \(the least that starts\)", err)
    assert fix, err
    assert run([*args, "--gpu-memory-utilization", fix.group(1)], capsys)[0] == 0
    below = f"{float(fix.group(1)) - 0.001:.3f}"  # the least: a thousandth less does not start
    assert float(below) <= utilization or run([*args, "--gpu-memory-utilization", below], capsys)[0] == 3


@FEW
@given(kernel_blocks=st.integers(404_000 // 16 + 1, 10**7))
def test_a_vllm_block_past_the_budget_names_the_largest_block_that_starts(kernel_blocks: int,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = [*PLAN, "--engine", "vllm"]
    code, err = run([*args, "--block-size", str(16 * kernel_blocks)], capsys)
    # Qwen3-8B on an H200: the null block and one of 404,000 tokens (147,456 B a token) fit vLLM's 110.96 GiB;
    # 404,016 not
    assert code == 3 and err.rstrip().endswith("--block-size 404000 (the largest that starts)"), err
    assert run([*args, "--block-size", "404000"], capsys)[0] == 0


@FEW
@given(step=st.integers(79_360, MAX_COUNT))
def test_a_vllm_step_whose_activations_take_the_budget_names_the_largest_step_that_starts(
        step: int, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*PLAN, "--engine", "vllm"]
    code, err = run([*args, "--max-num-batched-tokens", str(step)], capsys)
    # Qwen3-8B on an H200: the runtime estimate grows with the step's prefill activations; past 79,359 tokens
    # vLLM's budget no longer holds one request of 40,960 tokens
    assert code == 3 and "what would work: --max-num-batched-tokens 79359 (the largest that starts)" in err, err
    assert run([*args, "--max-num-batched-tokens", "79359"], capsys)[0] == 0


# ---- MXFP4 where neither engine quantizes with it ---------------------------------------------------------------

DENSE = ["Qwen3-8B", "Llama-3.1-8B-Instruct", "Mistral-7B-v0.1", "gemma-2-9b-it", "SmolLM2-135M"]


@FEW
@given(name=st.sampled_from(DENSE), exempt=st.booleans())
def test_an_mxfp4_config_on_a_dense_model_is_refused(name: str, exempt: bool, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    hf = json.loads((PRESET_DIR / f"{name}.json").read_text())
    hf["quantization_config"] = {"quant_method": "mxfp4", **({"modules_to_not_convert": ["lm_head"]} if exempt else {})}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    code, err = run(["plan", "--gpu", "H200", "--model", str(path)], capsys)
    assert code == 2 and "field 'quantization_config.quant_method' is 'mxfp4'; expected a model with routed experts" \
        in err, err


def test_mxfp4_on_a_moe_model_quantizes_the_experts_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # gpt-oss-20b exempts attention, router, embedding and head by name; both engines leave every non-expert layer
    # unquantized anyway, so without the list its weights are the same 13,761,511,424 B
    hf = json.loads((PRESET_DIR / "gpt-oss-20b.json").read_text())
    weights = []
    for keep in (True, False):
        if not keep:
            del hf["quantization_config"]["modules_to_not_convert"]
        path = tmp_path / f"{keep}.json"
        path.write_text(json.dumps(hf))
        assert main(["plan", "--gpu", "H200", "--model", str(path), "--json"]) == 0
        weights.append(json.loads(capsys.readouterr().out)["weights_bytes"])
    assert weights == [13_761_511_424, 13_761_511_424]
