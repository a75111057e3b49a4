"""Flags of a vLLM or SGLang launch command that this engine spells otherwise or does not size with.

An operator pastes `--max-model-len 8192` or `--host 0.0.0.0 --trust-remote-code` from a launch command,
or writes `gpu_memory_utilization` in a settings file; the command line and the settings-file reader
answer each with the flag to use here, or why it changes nothing here.
"""

from __future__ import annotations

# vLLM 0.34.0's field name -> SGLang's flag for it (with a note where the meaning is not one to one). The first
# six are ServerArgs fields too, read under --engine vllm; with SGLang's rules they are refused naming SGLang's.
VLLM_NAMES: dict[str, str] = {
    "max_model_len": "--context-length",
    "gpu_memory_utilization": "--mem-fraction-static (the share of the card for weights and KV cache)",
    "block_size": "--page-size",
    "max_num_seqs": "--max-running-requests",
    "max_num_batched_tokens": "--chunked-prefill-size",
    "enable_prefix_caching": "--disable-radix-cache to turn it off (SGLang's prefix cache is on by default)",
    "no_enable_prefix_caching": "--disable-radix-cache",
    "kv_cache_memory_bytes": "--kv-cache-memory",
    "num_gpu_blocks_override": "--max-total-tokens (in tokens: blocks x --page-size)",
    "enforce_eager": "--disable-cuda-graph",
    "speculative_config": "--speculative-algorithm with --speculative-draft-model",
}
VLLM_FIELDS = ("gpu_memory_utilization", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
               "enable_prefix_caching")

# SGLang's field -> vLLM 0.34.0's flag for the same knob, said when it is given under --engine vllm (which reads
# vLLM's spelling); "not modelled" where vLLM has the knob and `plan --engine vllm` does not size with it.
VLLM_COUNTERPARTS: dict[str, str] = {
    "context_length": "use --max-model-len",
    "mem_fraction_static": "use --gpu-memory-utilization",
    "page_size": "use --block-size",
    "max_running_requests": "use --max-num-seqs",
    "chunked_prefill_size": "use --max-num-batched-tokens",
    "disable_radix_cache": "use --no-enable-prefix-caching",
    "kv_cache_memory": "vLLM's --kv-cache-memory-bytes, not modelled here: drop it",
    "max_total_tokens": "vLLM's --num-gpu-blocks-override, not modelled here: drop it",
    "disable_cuda_graph": "vLLM's --enforce-eager, not modelled here: drop it",
    "cuda_graph_max_bs": "vLLM's --max-cudagraph-capture-size, not modelled here: drop it",
    "disable_hybrid_swa_memory": "vLLM's --disable-hybrid-kv-cache-manager, not modelled here: drop it",
    "mamba_ssm_dtype": "vLLM's --mamba-ssm-cache-dtype, not modelled here (its per-model default is): drop it",
    "disable_overlap_schedule": "vLLM's --no-async-scheduling, not modelled here: drop it",
    "speculative_algorithm": "vLLM's --speculative-config, not modelled here: drop it",
    # vLLM 0.34.0's FusedMoEParallelConfig.make splits a MoE's experts over DP x TP ranks even without expert
    # parallelism, so data parallelism changes the weights a GPU holds there; not modelled
    "dp_size": "vLLM's --data-parallel-size, not modelled here: it splits a MoE's experts "
               "over DP x TP ranks; drop it",
    "language_model_only": "vLLM has it too, not modelled here (its encoder is measured at start-up): drop it",
}
NO_VLLM_COUNTERPART = "no vLLM counterpart: drop it"

# --kv-cache-dtype values: vLLM 0.34.0's CacheDType (config/cache.py) that SGLang 0.5.23 does not take, and
# SGLang's that vLLM does not; each with the other engine's spelling of it, if any.
VLLM_KV_DTYPE_NAMES = {"fp8": "fp8_e4m3"}  # vLLM's fp8 is e4m3 on CUDA
SGLANG_KV_DTYPES = frozenset({"auto", "bfloat16", "bf16", "float16", "float32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"})
VLLM_MODELLED_KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
SGLANG_KV_DTYPE_NAMES = {"bf16": "use bfloat16", "fp4_e2m1": "vLLM's is nvfp4, not modelled here: use fp8 or auto",
                         "float32": "vLLM has no float32 cache dtype: use auto with --dtype float32"}

# Flags either engine takes that change nothing this engine sizes, or that it does not model.
NOT_SIZED_HERE: dict[str, str] = {
    **dict.fromkeys(("host", "port", "trust_remote_code", "served_model_name", "api_key", "log_level",
                     "random_seed", "seed", "tokenizer_path", "tokenizer", "revision", "download_dir",
                     "attention_backend", "enable_torch_compile", "max_prefill_tokens", "schedule_policy",
                     "schedule_conservativeness", "tool_call_parser",
                     "reasoning_parser", "chat_template", "enable_metrics", "stream_interval",
                     "max_queued_requests", "watchdog_timeout", "tokenizer_mode", "skip_tokenizer_init",
                     "grammar_backend", "sampling_backend", "disable_custom_all_reduce", "log_requests",
                     "enable_cache_report"),
                    "changes nothing this engine sizes: drop it"),
    **dict.fromkeys(("nnodes", "node_rank", "dist_init_addr"),
                    "changes nothing this engine sizes: the plan is per GPU, and --tp-size counts the GPUs of "
                    "every node: drop it"),
    **dict.fromkeys(("cuda_graph_bs", "cuda_graph_bs_decode"),
                    "is a list of batch sizes there; here the largest one sizes the graphs: --cuda-graph-max-bs N"),
    "cuda_graph_max_bs_prefill": "is not modelled: the prefill-graph reserve counts SGLang's sizes up to "
                                 "--chunked-prefill-size; to leave prefill graphs out, --disable-prefill-cuda-graph",
    **dict.fromkeys(("cuda_graph_backend_decode", "cuda_graph_backend_prefill"),
                    "is SGLang 0.5.23's per-phase switch: here --disable-decode-cuda-graph / "
                    "--disable-prefill-cuda-graph stand for 'disabled' (full and breakable size the same)"),
    "attn_dp_size": "is SGLang 0.5.23's name for attention DP: here --dp-size N --enable-dp-attention",
    "json_model_override_args": "is not read: edit a copy of config.json and pass that file with --model",
    "quantization": "is not modelled (online quantization): weights are sized in the format config.json's "
                    "quantization_config names",
    **dict.fromkeys(("ep_size", "ep", "expert_parallel_size", "enable_expert_parallel"),
                    "is not modelled: MoE weights are split over --tp-size"),
}


def _field(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def other_engines_hint(name: str) -> str | None:
    """What to say about another engine's `name` (a flag `--max-model-len` or a field `max_model_len`), or None."""
    field = _field(name)
    if field in VLLM_NAMES:
        return f"is vLLM's name; here use {VLLM_NAMES[field]}"
    if field in NOT_SIZED_HERE:
        return NOT_SIZED_HERE[field]
    return None


# Values another engine gives a special meaning that this engine does not model: (field, value as typed) -> what to do.
SPECIAL_VALUES: dict[tuple[str, str], str] = {
    ("chunked_prefill_size", "-1"): "is SGLang's 'no chunked prefill', not modelled here (a whole prompt then runs "
                                    "in one step): pass the longest prompt you will prefill, e.g. the context length",
    ("cuda_graph_max_bs", "-1"): "is not a batch size: --disable-cuda-graph turns the graphs off",
}


def special_value_hint(field: str, text: str) -> str | None:
    """What to say about `text` given to `field` where another engine reads it as a switch, or None."""
    return SPECIAL_VALUES.get((field, text.strip()))
