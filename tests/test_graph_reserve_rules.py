"""Which CUDA graphs SGLang 0.5.23 captures, so reserves: prefill graphs (none for KDA models or with its flag), decode graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main

H200_MIB = 143_771  # SGLang reads the card's capacity as nvidia-smi prints it, in MiB
KIMI_LINEAR = str(Path(__file__).parent / "model_corpus" / "Kimi-Linear-48B-A3B-Instruct.json")
# SGLang 0.5.23's reserve on an H200 at TP 1 without prefill graphs (MiB): 512 + 1.5 x the 8,192-token chunk +
# TP x PP / 8 GiB + 2 x the 256 decode graphs; above the 10 GiB floor
WITHOUT_PREFILL_GRAPHS_MIB = 512 + 1.5 * 8192 + 1024 / 8 + 2 * 256
MLA_PREFILL_GRAPHS_MIB = 1536


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", "--gpu", "H200", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_kda_models_reserve_no_prefill_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    """Kimi-Linear's KDA layers: SGLang turns its breakable prefill graphs off, so the 1,536 MiB an MLA model's
    prefill graphs would keep is not kept (0.896 with it)."""
    report = _plan(capsys, "--model", KIMI_LINEAR)
    assert report["mem_fraction_static"] == round((H200_MIB - WITHOUT_PREFILL_GRAPHS_MIB) / H200_MIB, 3) == 0.907
    assert any("no prefill CUDA graphs for KDA" in n for n in report["engine_notes"])
    # an MLA model without KDA layers keeps the 1,536 MiB
    deepseek = _plan(capsys, "--model", "DeepSeek-V2-Lite", "--kv-headroom", "fraction")["mem_fraction_static"]
    assert deepseek == round((H200_MIB - WITHOUT_PREFILL_GRAPHS_MIB - MLA_PREFILL_GRAPHS_MIB) / H200_MIB, 3) == 0.896


def test_a_kda_model_sglang_validated_keeps_its_prefill_graphs(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's exception is by architecture, anywhere in the list: named there, the model keeps its graphs."""
    config = json.loads(Path(KIMI_LINEAR).read_text())
    config["architectures"] = [*config["architectures"], "Glm5NextForConditionalGeneration"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    report = _plan(capsys, "--model", str(path))
    assert report["mem_fraction_static"] == 0.896 and not any("KDA" in n for n in report["engine_notes"])


def test_the_flag_drops_the_prefill_graph_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--kv-headroom", "fraction")
    off = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--kv-headroom", "fraction", "--disable-prefill-cuda-graph")
    assert plain["mem_fraction_static"] == 0.903  # 8 MiB for each captured prefill size
    assert off["mem_fraction_static"] == round((H200_MIB - WITHOUT_PREFILL_GRAPHS_MIB) / H200_MIB, 3) == 0.907
    assert off["max_total_num_tokens"] > plain["max_total_num_tokens"]


def test_vllm_refuses_sglangs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "H200", "--model", "Llama-3.1-8B-Instruct", "--engine", "vllm",
                 "--disable-prefill-cuda-graph"]) == 2
    assert "SGLang's knob under --engine vllm: --disable-prefill-cuda-graph (no vLLM counterpart: drop it)" in \
        capsys.readouterr().err


def test_the_kda_exception_list_is_sglangs() -> None:
    """The KDA rule in SGLang's own source names the architectures it still captures for: ours, no more."""
    import ast

    from kvcache.engines.sglang import KDA_PREFILL_GRAPH_ARCHITECTURES
    from reference_sources import reference_src_holding

    relative = "sglang/srt/arg_groups/cuda_graph_hook.py"
    tree = ast.parse((reference_src_holding(relative, "SGLang") / relative).read_text())
    rule = next(node for node in ast.walk(tree) if isinstance(node, ast.Tuple) and node.elts
                and isinstance(node.elts[0], ast.Constant) and node.elts[0].value == "KDA hybrid linear attention")
    named = {n.value for n in ast.walk(rule.elts[1]) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert named == KDA_PREFILL_GRAPH_ARCHITECTURES


def test_without_decode_graphs_their_term_goes_and_dp_attention_still_reads_the_batch_cap(
        capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang sets its decode graph batch cap (512 at TP 8 on an H200) whether or not it captures graphs, and the
    DP-attention term reads it: 3 x 512 x 8 + 1.5 x 512 x 8 = 18,432 MiB stay with --disable-cuda-graph (this
    project dropped them before: 0.903 and 687,209 tokens for DeepSeek-V3 at TP 8 x DP 8)."""
    base = 512 + 1.5 * 8192 + 1024 * 8 / 8 + 18_432  # chunk, TP x PP / 8 GiB, the DP term
    dp = ["--model", "DeepSeek-V3", "--tp-size", "8", "--enable-dp-attention", "--dp-size", "8",
          "--kv-headroom", "fraction"]
    no_graphs = _plan(capsys, *dp, "--disable-cuda-graph")["mem_fraction_static"]
    assert no_graphs == round((H200_MIB - base) / H200_MIB, 3) == 0.776
    no_decode = _plan(capsys, *dp, "--disable-decode-cuda-graph")["mem_fraction_static"]
    assert no_decode == round((H200_MIB - base - MLA_PREFILL_GRAPHS_MIB) / H200_MIB, 3) == 0.765
    llama = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--kv-headroom", "fraction",
                  "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph")["mem_fraction_static"]
    assert llama == round((H200_MIB - (WITHOUT_PREFILL_GRAPHS_MIB - 2 * 256)) / H200_MIB, 3)


def test_sglang_0_5_23s_decode_cap_flag_is_this_engines(capsys: pytest.CaptureFixture[str]) -> None:
    """--cuda-graph-max-bs-decode (SGLang 0.5.23 has no --cuda-graph-max-bs) sets the decode cap: 2 x 128 MiB."""
    fraction = _plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--kv-headroom", "fraction",
                     "--cuda-graph-max-bs-decode", "128")["mem_fraction_static"]
    assert fraction == round((H200_MIB - (WITHOUT_PREFILL_GRAPHS_MIB - 2 * 256 + 2 * 128 + 8 * 58)) / H200_MIB, 3) == 0.905
