"""`plan --engine vllm`: vLLM 0.34.0's blocks and max concurrency on a card, its knobs, and what it refuses.

Numbers by hand: an H200 is 150,109,880,320 B; at gpu_memory_utilization 1.0 vLLM's KV memory is that less
the weights and the runtime, a dry run's estimate of which is the project's reserve for the card
(13,904 MiB = 14,579,400,704 B on an H200, tests/test_vllm_plan.py). Qwen3-8B: 36 layers x 8 KV heads x
128 x 2 x 2 B = 147,456 B per token; a 64-token block of every layer is 9,437,184 B.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main

H200 = 150_109_880_320
RUNTIME = 14_579_400_704
BLOCK = 9_437_184


def plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--engine", "vllm", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_answer_names_vllm_its_blocks_and_what_is_estimated(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(["--json", "--max-model-len", "32768"], capsys)
    report = json.loads(out)
    a = report["vllm"]
    assert code == 0 and (report["engine"], report["engine_version"]) == ("vllm", "0.34.0")
    assert report["estimated"] == ["estimated_runtime_bytes"] and a["estimated_runtime_bytes"] == RUNTIME
    assert a["available_bytes"] == H200 - a["weights_bytes"] - RUNTIME
    assert (a["block_size"], a["bytes_per_block"], a["blocks_per_request"]) == (64, BLOCK, 512)
    assert a["num_gpu_blocks"] == a["available_bytes"] // BLOCK
    assert a["max_concurrency"] == a["num_gpu_blocks"] / 512 and a["kv_cache_tokens"] == a["num_gpu_blocks"] * 64


# the keys every plan's JSON has at the top, whichever engine's rules it follows
COMMON_KEYS = {"model", "engine", "engine_version", "device", "card", "model_dtype", "kv_cache_dtype", "page_size",
               "context_length", "bytes_per_token", "max_total_num_tokens", "max_running_requests", "budget_bytes",
               "total_memory_bytes", "weights_bytes"}


def test_json_keeps_the_top_level_keys_of_every_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--context-length", "32768", "--json"]) == 0
    sglang = json.loads(capsys.readouterr().out)
    code, out, _ = plan(["--json", "--max-model-len", "32768"], capsys)
    report = json.loads(out)
    assert code == 0 and COMMON_KEYS <= set(sglang) and COMMON_KEYS <= set(report)
    a = report["vllm"]
    # 36 layers x 8 KV heads x 128 x (K, V) x 2 B = 147,456 B a token, both engines; vLLM's default max_num_seqs on
    # a card of 70 GiB or more is 1024
    assert report["bytes_per_token"] == sglang["bytes_per_token"] == 147_456
    assert (report["page_size"], report["context_length"], report["max_running_requests"]) == (64, 32768, 1024)
    assert (report["max_total_num_tokens"], report["budget_bytes"]) == (a["kv_cache_tokens"], a["available_bytes"])
    assert (report["total_memory_bytes"], report["weights_bytes"]) == (H200, sglang["weights_bytes"])


def test_text_report_prints_blocks_concurrency_and_marks_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(["--gpu-memory-utilization", "0.9", "--block-size", "32", "--max-model-len", "32768"], capsys)
    assert code == 0
    assert "engine              vllm 0.34.0" in out and "x gpu_memory_utilization 0.9" in out
    assert "ESTIMATED" in out.split("runtime", 1)[1].splitlines()[0]
    assert "block size 32" in out and "blocks a request    1,024" in out and "max concurrency" in out


def test_a_card_too_small_is_refused_with_the_length_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--engine", "vllm"])
    err = capsys.readouterr().err
    assert code == 3 and "vLLM 0.34.0 would refuse to start" in err and "--max-model-len " in err
    longest = int(err.split("--max-model-len ")[1].split()[0])
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--engine", "vllm", "--max-model-len", str(longest)]) == 0
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--engine", "vllm",
                 "--max-model-len", str(longest + 64)]) == 3


def test_a_utilization_below_the_weights_says_nothing_is_left_not_a_negative_budget(
        capsys: pytest.CaptureFixture[str]) -> None:
    # 0.01 x 150,109,880,320 B = 1.5 GB is below Qwen3-8B's weights (about 16 GB) alone: no KV memory at all.
    # One request of 40,960 tokens is 40,960 / 64 = 640 blocks of 9,437,184 B, the null block one more:
    # 641 x 9,437,184 = 6,049,234,944 B needed
    code, _, err = plan(["--gpu-memory-utilization", "0.01"], capsys)
    assert code == 3 and err.count("\n") == 1 and "-" not in err.split("(needed")[1].split(";")[0]
    assert "needs 640 blocks of 9,437,184 B, and the memory vLLM may use leaves nothing for them" in err
    assert "(needed 5.63 GiB (6,049,234,944 B), available 0.00 GiB (0 B))" in err
    fraction = err.split("--gpu-memory-utilization ")[1].split()[0]
    assert plan(["--gpu-memory-utilization", fraction], capsys)[0] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mem-fraction-static", "0.8"], "SGLang's knob under --engine vllm: --mem-fraction-static "
                                           "(use --gpu-memory-utilization)"),
        (["--context-length", "8192", "--page-size", "16"],
         "SGLang's knobs under --engine vllm: --context-length (use --max-model-len); --page-size (use --block-size)"),
        (["--chunked-prefill-size", "512"], "--chunked-prefill-size (use --max-num-batched-tokens)"),
        (["--disable-radix-cache"], "--disable-radix-cache (use --no-enable-prefix-caching)"),
        (["--disable-hybrid-swa-memory"], "--disable-hybrid-swa-memory (vLLM's --disable-hybrid-kv-cache-manager, "
                                          "not modelled here: drop it)"),
        # vLLM 0.34.0's FusedMoEParallelConfig.make splits experts over data_parallel_size x tp_size ranks
        (["--dp-size", "2"], "--dp-size (vLLM's --data-parallel-size, not modelled here: it splits a MoE's experts "
                             "over DP x TP ranks; drop it)"),
        (["--swa-full-tokens-ratio", "0.5"], "--swa-full-tokens-ratio (no vLLM counterpart: drop it)"),
        (["--block-size", "24"], "--block-size 24 is not a multiple of 16 (vLLM 0.34.0's FlashAttention kernel "
                                 "block); try --block-size 16"),
        (["--kv-cache-dtype", "fp4_e2m1"], "fp4_e2m1 is SGLang's spelling: under --engine vllm vLLM's is nvfp4, not "
                                           "modelled here: use fp8 or auto"),
        (["--kv-cache-dtype", "bf16"], "--kv-cache-dtype bf16 is SGLang's spelling: under --engine vllm use bfloat16"),
        (["--kv-cache-dtype", "nvfp4"], "--kv-cache-dtype nvfp4 (vLLM 0.34.0's) is not modelled for --engine vllm"),
    ],
)
def test_the_other_engines_knobs_are_refused_naming_vllms(argv: list[str], message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan(argv, capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_vllms_own_spellings_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's fp8 is e4m3: 36 x 8 x 128 x 2 x 1 B = 73,728 B a token, a 64-token block 4,718,592 B;
    # 8,192 tokens take 128 blocks
    code, out, _ = plan(["--json", "--kv-cache-dtype", "fp8", "--max-model-len", "8192", "--max-num-seqs", "64",
                         "--max-num-batched-tokens", "4096"], capsys)
    a = json.loads(out)["vllm"]
    assert code == 0 and json.loads(out)["kv_cache_dtype"] == "fp8_e4m3" and a["bytes_per_block"] == 4_718_592
    assert (a["max_model_len"], a["max_num_seqs"], a["max_num_batched_tokens"], a["blocks_per_request"]) == \
        (8192, 64, 4096, 128)


@pytest.mark.parametrize(
    ("argv", "message", "fixes"),
    [
        # vLLM's SchedulerConfig: max_num_batched_tokens below max_num_seqs (1024 by default on an H200)
        (["--max-num-batched-tokens", "512"], "--max-num-batched-tokens 512 is below max_num_seqs 1024 (vLLM's "
         "default for this card): vLLM 0.34.0's SchedulerConfig refuses it (max_num_batched_tokens must be at least "
         "max_num_seqs); use --max-num-batched-tokens 1024 or --max-num-seqs 512",
         (["--max-num-batched-tokens", "1024"], ["--max-num-batched-tokens", "512", "--max-num-seqs", "512"])),
        (["--max-num-seqs", "10000"], "max_num_batched_tokens 8192 (vLLM's default for this card) is below "
         "--max-num-seqs 10000: vLLM 0.34.0's SchedulerConfig refuses it (max_num_batched_tokens must be at least "
         "max_num_seqs); use --max-num-batched-tokens 10000 or --max-num-seqs 8192", (["--max-num-seqs", "8192"], ["--max-num-seqs", "10000",
                                                                "--max-num-batched-tokens", "10000"])),
        # config/model.py: a max_model_len past the model's (Qwen3-8B: 40,960)
        (["--max-model-len", "50000"], "--max-model-len 50000 is greater than Qwen3-8B's derived max_model_len "
         "(max_position_embeddings 40960), which vLLM 0.34.0 refuses; use --max-model-len 40960, or --allow-long-context",
         (["--max-model-len", "40960"],
                                             ["--max-model-len", "50000", "--allow-long-context"])),
    ],
)
def test_vllms_start_up_checks_refuse_with_values_that_start(argv: list[str], message: str,
                                                             fixes: tuple[list[str], ...],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan(argv, capsys)
    assert code == 2 and message in err and err.count("\n") == 1
    for fix in fixes:  # each value the line names starts
        assert plan(fix, capsys)[0] == 0


def test_a_settings_file_takes_vllms_names_under_its_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "vllm.toml"
    cfg.write_text('engine = "vllm"\nmax-model-len = 8192\nkv_cache_dtype = "fp8"\nenable_prefix_caching = false\n'
                   'max_num_seqs = 64\n')
    code = main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--config", str(cfg), "--json"])
    a = json.loads(capsys.readouterr().out)["vllm"]
    assert code == 0 and (a["max_model_len"], a["enable_prefix_caching"], a["max_num_seqs"]) == (8192, False, 64)
    cfg.write_text("max_model_len = 8192\n")  # SGLang's rules (the default engine) spell it context_length
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--config", str(cfg)]) == 2
    assert "--max-model-len is vLLM's knob: add --engine vllm, or with SGLang's rules use --context-length" in \
        capsys.readouterr().err


def test_vllm_knobs_need_the_vllm_engine_and_bootstrap_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--gpu-memory-utilization", "0.9"]) == 2
    assert "--gpu-memory-utilization is vLLM's knob: add --engine vllm, or with SGLang's rules use " \
           "--mem-fraction-static" in capsys.readouterr().err
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--max-model-len", "8192"]) == 2
    assert "--max-model-len is vLLM's knob: add --engine vllm, or with SGLang's rules use --context-length" in \
        capsys.readouterr().err
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--kv-cache-dtype", "fp8"]) == 2
    assert "--kv-cache-dtype fp8 is vLLM's spelling: add --engine vllm, or with SGLang's rules use --kv-cache-dtype " \
           "fp8_e4m3" in capsys.readouterr().err
    assert main(["--model", "SmolLM2-135M", "--device", "cpu", "--engine", "vllm"]) == 2
    assert "--engine vllm is a dry run of vLLM's block plan: use plan --engine vllm" in capsys.readouterr().err


def test_prefix_caching_is_on_by_default_and_puts_mamba_layers_in_align_mode(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Nemotron-H-56B at TP 2 (vLLM's own log: 46.40x on an H200): block 4,160 tokens; 6 Mamba groups and one full
    # group. Prefix caching on: 6 x 3 + cdiv(8,192, 4,160) = 20 blocks a request; off: 6 x 1 + 2 = 8
    argv = ["plan", "--model", "Nemotron-H-56B-Base-8K", "--gpu", "H200", "--engine", "vllm", "--tp-size", "2", "--json"]
    assert main(argv) == 0
    on = json.loads(capsys.readouterr().out)["vllm"]
    assert main([*argv, "--no-enable-prefix-caching"]) == 0
    off = json.loads(capsys.readouterr().out)["vllm"]
    assert (on["enable_prefix_caching"], on["mamba_cache_mode"], off["mamba_cache_mode"]) == (True, "align", "none")
    assert (on["block_size"], on["blocks_per_request"], off["blocks_per_request"]) == (4160, 20, 8)
    assert on["num_gpu_blocks"] == off["num_gpu_blocks"] and round(on["max_concurrency"], 2) == 46.4
    assert main([*argv, "--enable-prefix-caching"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["blocks_per_request"] == 20


def test_weights_that_do_not_fit_suggest_a_tp_size_for_the_weights_alone(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V2-Lite's bf16 weights (31,413,239,808 B) overflow a 24 GiB card; vLLM's blocks at TP 2 are vLLM's own
    # answer, so the suggestion checks the weights alone (it once printed "--engine vllm plans vLLM's own blocks").
    assert main(["plan", "--engine", "vllm", "--model", "DeepSeek-V2-Lite", "--gpu-memory", "24GiB"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: does not fit: DeepSeek-V2-Lite's target weights (29.26 GiB")
    assert ("what would work: --tp-size 2 (about 14.66 GiB (15,743,320,064 B) per rank, for the weights alone: the "
            "KV cache then needs more)") in err


def test_sparse_mla_takes_vllms_fp8_not_its_fp8_e4m3(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V3.2 at TP 8: --kv-cache-dtype fp8 is FlashMLA sparse's fp8_ds_mla row, 132 B of indexer key + 656 B of
    # latent a token and layer: a 64-token block of 61 layers is 64 x 788 x 61 = 3,076,352 B. Spelled fp8_e4m3, vLLM
    # picks FlashInfer's sparse backend (plain fp8 rows), which is not modelled: refused naming fp8
    argv = ["plan", "--model", str(Path(__file__).with_name("model_corpus") / "DeepSeek-V3.2.json"), "--gpu", "H200",
            "--engine", "vllm",
            "--tp-size", "8", "--max-model-len", "32768", "--json"]
    assert main([*argv, "--kv-cache-dtype", "fp8"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["bytes_per_block"] == 3_076_352
    assert main([*argv, "--kv-cache-dtype", "fp8_e4m3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --kv-cache-dtype fp8 (FlashMLA sparse's fp8_ds_mla row) or auto" in err


def test_an_a100_keeps_vllms_small_batch_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's get_batch_defaults: 70 GiB or more takes max_num_seqs 1024 and max_num_batched_tokens 8192, but an A100
    # (by its device name) stays on 256 and 2048 as the smaller cards do; an H100-80GB does not
    got = {}
    for gpu in ("A100-80GB", "H100-80GB", "L40S"):
        assert main(["plan", "--model", "Qwen3-8B", "--gpu", gpu, "--engine", "vllm",
                     "--max-model-len", "8192", "--json"]) == 0
        a = json.loads(capsys.readouterr().out)["vllm"]
        got[gpu] = (a["max_num_seqs"], a["max_num_batched_tokens"])
    assert got == {"A100-80GB": (256, 2048), "H100-80GB": (1024, 8192), "L40S": (256, 2048)}
