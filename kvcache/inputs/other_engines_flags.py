"""Flags of a vLLM or SGLang launch command that this engine spells otherwise or does not size with.

An operator pastes `--max-model-len 8192` or `--host 0.0.0.0 --trust-remote-code` from a launch command,
or writes `gpu_memory_utilization` in a settings file; the command line and the settings-file reader
answer each with the flag to use here, or why it changes nothing here.
"""

from __future__ import annotations

# vLLM 0.34.0's field name -> this engine's flag (with a note where the meaning is not one to one); said where
# a command has no such flag (`plan --engine vllm` takes --gpu-memory-utilization and --block-size as they are).
VLLM_NAMES: dict[str, str] = {
    "max_model_len": "--context-length",
    "gpu_memory_utilization": "--mem-fraction-static (the share of the card for weights and KV cache)",
    "kv_cache_memory_bytes": "--kv-cache-memory",
    "block_size": "--page-size",
    "max_num_seqs": "--max-running-requests",
    "max_num_batched_tokens": "--chunked-prefill-size",
    "num_gpu_blocks_override": "--max-total-tokens (in tokens: blocks x --page-size)",
    "enforce_eager": "--disable-cuda-graph",
    "no_enable_prefix_caching": "--disable-radix-cache",
    "speculative_config": "--speculative-algorithm with --speculative-draft-model",
}

# Flags either engine takes that change nothing this engine sizes, or that it does not model.
NOT_SIZED_HERE: dict[str, str] = {
    **dict.fromkeys(("host", "port", "trust_remote_code", "served_model_name", "api_key", "log_level",
                     "random_seed", "seed", "tokenizer_path", "tokenizer", "revision", "download_dir",
                     "attention_backend", "enable_torch_compile", "max_prefill_tokens", "schedule_policy",
                     "schedule_conservativeness", "enable_prefix_caching"),
                    "changes nothing this engine sizes: drop it"),
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
