"""vLLM 0.34.0's names for the knobs this engine sizes with, and what says the same thing here.

An operator coming from vLLM types `--max-model-len` or writes `gpu_memory_utilization` in a settings
file; both the command line and the settings-file reader answer with the name to use instead.
"""

from __future__ import annotations

# vLLM's field name -> this engine's flag (with a note where the meaning is not one to one).
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
    "enable_prefix_caching": "nothing: the prefix (radix) cache is on unless --disable-radix-cache",
    "speculative_config": "--speculative-algorithm with --speculative-draft-model",
    "quantization": "nothing: weights are sized in the format config.json's quantization_config names",
}


def vllm_equivalent(name: str) -> str | None:
    """What to use here for vLLM's `name` (a flag `--max-model-len` or a field `max_model_len`), or None."""
    return VLLM_NAMES.get(name.lstrip("-").replace("-", "_"))
