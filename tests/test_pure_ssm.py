"""Pure state-space models (no attention layer) plan under both engines as each sizes them.

SGLang 0.5.23: state slots from the budget's r / (1 + r) share (r = --mamba-full-memory-ratio, 0.9), each slot a
bfloat16 conv window and a float32 SSM state per layer; a token pool of no bytes and --max-total-tokens (else the
context length) token slots; requests capped by usable slots // slots per request. vLLM 0.34.0: one state block a
request, conv and SSM state both in the model dtype (mamba_ssm_cache_dtype "auto"). The configs state no context
length: both engines take 2048.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.weights import count_parameters
from kvcache.byte_units import GiB
from kvcache.inputs.dtypes import STATE_DTYPES, resolve_kv_cache_dtype, resolve_model_dtype
from kvcache.inputs.parallel import ParallelState
from kvcache.models.hf_config import model_config_from_hf
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.layer_specs import RecurrentStateSpec, model_layer_specs

CORPUS = Path(__file__).with_name("model_corpus")
CODESTRAL, FALCON, GRANITE = "Mamba-Codestral-7B-v0.1", "falcon-mamba-7b", "GraniteMoeHybrid-default-transformers5"
BF16, FP32 = 2, 4

# One layer's state: conv channels x (kernel - 1) + SSM heads x head_dim x state, from each config's fields.
# Codestral: Mamba-2, 128 heads x 64, 8 groups of state 128, kernel 4: conv 8,192 + 2 x 8 x 128 = 10,240 channels
# Falcon-Mamba: Mamba-1, intermediate_size 8,192 channels, state 16 (SGLang's full-rank shape: heads of head_dim 1)
# Granite-4 default (transformers 5): 128 heads x 64, 1 group of state 256: conv 8,192 + 2 x 256 = 8,704 channels
LAYER_STATE = {
    CODESTRAL: (64, 10_240 * 3, 128 * 64 * 128),
    FALCON: (64, 8_192 * 3, 8_192 * 1 * 16),
    GRANITE: (32, 8_704 * 3, 128 * 64 * 256),
}


def corpus(name: str) -> ModelConfig:
    return model_config_from_hf(CORPUS / f"{name}.json", name=name)


def state_bytes(name: str, *, ssm_itemsize: int) -> int:
    """Bytes of one request's state, every layer: conv in bfloat16, SSM state in `ssm_itemsize` bytes."""
    layers, conv, ssm = LAYER_STATE[name]
    return layers * (conv * BF16 + ssm * ssm_itemsize)


def our_state_bytes(name: str, *, tp: int = 1, ssm_dtype: str = "float32") -> int:
    m = corpus(name)
    dtype = resolve_model_dtype("auto", m.checkpoint_dtype)
    placements = model_layer_specs(m, ParallelState(tp_size=tp), resolve_kv_cache_dtype("auto", dtype),
                                   model_dtype=dtype, ssm_dtype=STATE_DTYPES[ssm_dtype])
    assert placements and all(isinstance(p.spec, RecurrentStateSpec) for p in placements)
    return sum(p.spec.bytes_per_request for p in placements)


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(LAYER_STATE))
def test_state_bytes_by_hand(name: str) -> None:
    # SGLang 0.5.23: float32 SSM state (--mamba-ssm-dtype's default); Codestral 64 x (61,440 + 4,194,304) = 272,367,616
    assert our_state_bytes(name) == state_bytes(name, ssm_itemsize=FP32)
    assert our_state_bytes(CODESTRAL) == 272_367_616


def test_state_splits_over_tensor_parallel_ranks() -> None:
    # Codestral at TP 2: 64 heads and 4 groups a rank: conv (4,096 + 2 x 4 x 128) x 3, SSM 64 x 64 x 128
    assert our_state_bytes(CODESTRAL, tp=2) == 64 * (5_120 * 3 * BF16 + 64 * 64 * 128 * FP32)


# Codestral per layer: in_proj 4,096 x (2 x 8,192 + 2 x 8 x 128 + 128), conv 10,240 x 4 + bias, dt_bias/A/D 3 x 128,
# gated norm 8,192, out_proj 8,192 x 4,096, norm 4,096 = 109,640,064; x 64, + 2 x 32,768 x 4,096 + 4,096: the model
# card's 7,285,403,648. Falcon-Mamba per layer: in_proj 4,096 x 16,384, conv 8,192 x 4 + bias, x_proj 8,192 x
# (256 + 2 x 16), dt_proj 256 x 8,192 + bias, A 8,192 x 16, D 8,192, out_proj 8,192 x 4,096, norm 4,096
# = 105,312,256; x 64, + 2 x 65,024 x 4,096 + 4,096 (the card's 7.27B). Granite-4 default per layer: the Mamba-2
# mixer 4,096 x 17,024 + 8,704 x 5 + 384 + 8,192 + 8,192 x 4,096 = 103,336,832, 8 experts of 4,096 x 22,016 +
# 11,008 x 4,096, router 8 x 4,096, shared MLP 4,096 x 2,048 + 1,024 x 4,096, 2 norms = 1,198,091,136; x 32,
# + 2 x 32,000 x 4,096 + 4,096.
@pytest.mark.parametrize(("name", "expected"), [
    (CODESTRAL, 64 * 109_640_064 + 2 * 32_768 * 4_096 + 4_096),  # 7,285,403,648
    (FALCON, 64 * 105_312_256 + 2 * 65_024 * 4_096 + 4_096),  # 7,272,665,088
    (GRANITE, 32 * 1_198_091_136 + 2 * 32_000 * 4_096 + 4_096),  # 38,601,064,448
])
def test_parameters_by_hand(name: str, expected: int) -> None:
    assert count_parameters(corpus(name)) == expected
    assert count_parameters(corpus(CODESTRAL)) == 7_285_403_648


@pytest.mark.parametrize("name", sorted(LAYER_STATE))
def test_no_attention_no_heads_and_the_engines_default_length(name: str) -> None:
    m = corpus(name)
    assert set(m.layer_kinds) == {"mamba2"} and m.kv_layer_count == 0
    assert m.max_position_embeddings == 2048


def test_sglang_plan_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """8 GiB for Codestral: the state share 8 GiB x 0.9 / 1.9 holds 14 slots of 272,367,616 B (the first padding), so
    13 usable, 4 requests of 3 slots each; 2,048 token slots (the context), which hold no bytes."""
    d = plan_json(["plan", "--model", str(CORPUS / f"{CODESTRAL}.json"), "--gpu", "H200", "--kv-cache-memory", "8GiB"],
                  capsys)
    share = 8 * GiB * 9 // 19
    assert share // 272_367_616 == 14 == d["plan"]["state_pool"]["num_slots"]
    assert d["buffers"]["state"] == 14 * 272_367_616
    assert d["max_running_requests"] == (14 - 1) // 3 == 4
    assert d["max_total_num_tokens"] == 2048 and d["bytes_per_token"] is None
    assert d["state_bytes_per_request"] == 3 * 272_367_616
    assert d["plan"]["kv_pools"] == []


def test_max_total_tokens_sets_the_token_slots(capsys: pytest.CaptureFixture[str]) -> None:
    # Falcon-Mamba on 8 GiB: 110 slots of 36,700,160 B; 1,000 token slots cap requests at 1,000 // 2
    d = plan_json(["plan", "--model", str(CORPUS / f"{FALCON}.json"), "--gpu", "H200", "--kv-cache-memory", "8GiB",
                   "--max-total-tokens", "1000"], capsys)
    assert (8 * GiB * 9 // 19) // 36_700_160 == 110 == d["plan"]["state_pool"]["num_slots"]
    assert d["max_total_num_tokens"] == 1000
    assert d["max_running_requests"] == min(1000 // 2, (110 - 1) // 3) == 36


def test_the_report_says_state_not_bytes_per_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(CORPUS / f"{GRANITE}.json"), "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    assert "bytes per token" not in out and "max total tokens" not in out
    # Granite keeps SGLang's extra-buffer tracking slots: 5 a request of 32 x (52,224 + 8,388,608) B
    assert "state per request   1.26 GiB (1,350,533,120 B)" in out
    assert "token slots         2,048" in out


# vLLM's default mamba_cache_mode: "none" (prefix caching off) for the attention-free Mamba / Mamba-2 classes, one
# state block a request; "align" for Granite-4, which stays IsHybrid without attention layers: the running state,
# the last aligned one and the Mamba-2 mixer's prefill checkpoint, 3 blocks.
VLLM_BLOCKS = {CODESTRAL: ("none", 1), FALCON: ("none", 1), GRANITE: ("align", 3)}


@pytest.mark.parametrize("name", sorted(LAYER_STATE))
def test_vllm_plan_by_hand(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM: one Mamba group, the block one request's state in bfloat16 (conv and SSM), not padded (no attention
    page to pad it to)."""
    d = plan_json(["plan", "--model", str(CORPUS / f"{name}.json"), "--gpu", "H200", "--engine", "vllm"], capsys)
    v = d["vllm"]
    block = state_bytes(name, ssm_itemsize=BF16)
    mode, blocks = VLLM_BLOCKS[name]
    assert v["bytes_per_block"] == block and (v["mamba_cache_mode"], v["blocks_per_request"]) == (mode, blocks)
    # a Mamba block spans max_model_len tokens in mode none, the cache block (64) in align: vLLM's mamba_block_size
    assert [(g["kind"], g["block_size"]) for g in v["groups"]] == [("mamba", 2048 if mode == "none" else 64)]
    assert v["num_gpu_blocks"] == v["available_bytes"] // block
    assert v["max_concurrency"] == v["num_gpu_blocks"] / blocks


def test_vllm_report_names_requests_not_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(CORPUS / f"{FALCON}.json"), "--gpu", "H200", "--engine", "vllm"]) == 0
    out = capsys.readouterr().out
    # Falcon-Mamba in bfloat16: 64 x (24,576 x 2 + 131,072 x 2) = 19,922,944 B a request
    assert "state per request   0.02 GiB (19,922,944 B)" in out and "bytes per block" not in out


def test_token_slots_that_bind_say_the_max_total_tokens_that_frees_them(capsys: pytest.CaptureFixture[str]) -> None:
    """8 GiB for Codestral serves 4 requests (state slots), but 2,048 token slots hold one request of 2,048 tokens:
    the note names --max-total-tokens 4 x 2,048 = 8,192, which planned again serves all 4 at full length."""
    argv = ["plan", "--model", str(CORPUS / f"{CODESTRAL}.json"), "--gpu", "H200", "--kv-cache-memory", "8GiB"]
    d = plan_json(argv, capsys)
    [note] = [n for n in d["capacity_notes"] if n["cap"] == "token_slots"]
    assert note["fixes"] == ["--max-total-tokens 8192"] and "fit 1 request of 2,048 tokens at once, while 4" in note["message"]
    # counts in prose carry separators, the flag's value stays pasteable
    assert note["message"].endswith("; for all of them at full length, 8,192 token slots: --max-total-tokens 8192")
    d = plan_json([*argv, "--max-total-tokens", "8192"], capsys)
    assert (d["max_total_num_tokens"], d["max_running_requests"]) == (8192, 4)
    assert not [n for n in d["capacity_notes"] if n["cap"] == "token_slots"]


@pytest.mark.parametrize(("extra", "held"), [([], 2048 // 2048), (["--max-total-tokens", "4096"], 4096 // 2048)])
def test_fit_counts_the_requests_the_token_slots_hold(extra: list[str], held: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fit", "--model", str(CORPUS / f"{FALCON}.json"), "--requests", "2", "--context-length", "2048",
            "--gpu", "H200", "--tp-size", "1", "--kv-cache-dtype", "auto", "--json", *extra]
    main(argv)
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert row["requests_at_context"] == held


def test_the_token_slot_fix_plans_until_the_running_cap_agrees(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny Mamba-2 (2 layers of 8 heads x 64, state 16: 2 x ((512 + 32) x 3 x 2 + 8 x 64 x 16 x 4) = 72,064 B a
    slot) on 8 GiB: 56,462 slots serve 18,820 requests; the default 2,048 token slots run 1,024 (2,048 // 2). At
    1,024 x 2,048 slots SGLang's cap rises to 4,096 (clamp(T x 512 // 2,048, 2048, 4096)), so the fix is
    4,096 x 2,048 = 8,388,608 slots, under which all 4,096 run at full length."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 256, "num_hidden_layers": 2,
        "vocab_size": 1000, "num_heads": 8, "head_dim": 64, "expand": 2, "n_groups": 1, "state_size": 16,
        "conv_kernel": 4, "torch_dtype": "bfloat16"}))
    argv = ["plan", "--model", str(path), "--gpu", "H200", "--kv-cache-memory", "8GiB"]
    d = plan_json(argv, capsys)
    assert (8 * GiB * 9 // 19) // 72_064 == 56_462 == d["plan"]["state_pool"]["num_slots"]
    assert d["max_running_requests"] == 1024
    [note] = [n for n in d["capacity_notes"] if n["cap"] == "token_slots"]
    assert note["fixes"] == ["--max-total-tokens 8388608"]
    d = plan_json([*argv, "--max-total-tokens", "8388608"], capsys)
    assert d["max_running_requests"] == 4096 == d["max_total_num_tokens"] // 2048


def test_pipeline_stages_say_their_state_not_bytes_per_token(capsys: pytest.CaptureFixture[str]) -> None:
    # Codestral at --pp-size 2: 32 layers a stage, 3 slots a request: 3 x 32 x 4,255,744 = 408,551,424 B
    assert main(["plan", "--model", str(CORPUS / f"{CODESTRAL}.json"), "--gpu", "H200", "--pp-size", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("state 0.38 GiB (408,551,424 B) a request") == 2 and "B/token" not in out


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("intermediate_size", 4096, "config.json field 'intermediate_size' is 4096; expected expand x hidden_size = 8192"),
    ("num_heads", 100, "config.json field 'num_heads' is 100; expected expand x hidden_size / head_dim = 8192 / 64"),
])
def test_a_mamba2_width_the_engines_would_read_apart_is_refused_in_one_line(
        field: str, value: int, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang 0.5.23 sizes a Mamba-2 conv state by intermediate_size, vLLM 0.34.0 by expand x hidden_size."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads((CORPUS / f"{CODESTRAL}.json").read_text()) | {field: value}))
    assert main(["plan", "--model", str(path), "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_kv_cache_dtype_without_per_token_kv_is_accepted_and_named(engine: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang 0.5.23 (mem_cache/kv_cache_dtype.py) and vLLM 0.34.0 (CacheConfig) accept --kv-cache-dtype fp8_e4m3
    for a model with no attention layer; it sizes nothing, so the plan says so in one note and its numbers stay."""
    argv = ["plan", "--model", str(CORPUS / f"{CODESTRAL}.json"), "--gpu", "H200", "--engine", engine]
    plain, fp8 = plan_json(argv, capsys), plan_json([*argv, "--kv-cache-dtype", "fp8_e4m3"], capsys)
    label = {"sglang": "SGLang 0.5.23", "vllm": "vLLM 0.34.0"}[engine]
    assert plain["engine_notes"] == [] and fp8["engine_notes"] == [
        f"--kv-cache-dtype fp8_e4m3 sizes nothing for {CODESTRAL}: it has no per-token KV (every layer is recurrent "
        f"state, which keeps its own dtypes); {label} accepts the flag and runs as without it"]
    assert {k: v for k, v in fp8.items() if k not in ("engine_notes", "kv_cache_dtype", "timings_s")} == \
        {k: v for k, v in plain.items() if k not in ("engine_notes", "kv_cache_dtype", "timings_s")}
    if engine == "sglang":  # 3 slots a request x 64 layers x (10,240 x 3 x 2 conv + 128 x 64 x 128 x 4 SSM) B
        assert fp8["state_bytes_per_request"] == 3 * 64 * (10_240 * 3 * 2 + 128 * 64 * 128 * 4) == 817_102_848
