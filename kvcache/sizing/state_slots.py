"""How many recurrent-state slots one request holds in a hybrid (Mamba / linear-attention) model.

Follows SGLang 0.5.23 (`MambaPool` sizing in `mem_cache/kv_cache_configurator.py`,
`_calculate_mamba_ratio`; the strategy from `arg_groups/overrides.py`,
`_mamba_radix_cache_resolution`; tracking slots from `mem_cache/allocation_sizing.py`):

- without the radix cache: 1 (the running state);
- with it: 3 (running state plus the prefix-cache states a request pins between
  prefill and decode), plus the "extra buffer" tracking slots when the radix cache keeps
  states mid-sequence: 2 with the overlap scheduler (ping-pong), 1 without it.
  SGLang chooses the extra buffer when the architecture supports it and the overlap
  scheduler is on or pages are larger than one token. Default: 3 + 2 = 5.
"""

from __future__ import annotations

BASE_RADIX_SLOTS_PER_REQUEST = 3

# Hybrid architectures whose prefix cache can keep states mid-sequence ("extra_buffer") in
# SGLang 0.5.23 with its default triton linear-attention backend.
EXTRA_BUFFER_ARCHITECTURES = frozenset({
    "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration",
    "FalconH1ForCausalLM", "Glm5NextForConditionalGeneration", "GraniteMoeHybridForCausalLM",
    "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP", "InternS2PreviewForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "KimiLinearForCausalLM", "MiniCPMV4_6ForConditionalGeneration",
    "MiniCPMV4_7ForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "NemotronH_Omni_Reasoning_V3", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
})


def uses_extra_buffer(*, architecture: str, page_size: int, disable_overlap_schedule: bool) -> bool:
    """Whether the radix cache keeps tracking states for this model (SGLang 0.5.23's 'auto' strategy)."""
    return architecture in EXTRA_BUFFER_ARCHITECTURES and (not disable_overlap_schedule or page_size > 1)


def state_slots_per_request(
    *, architecture: str, disable_radix_cache: bool, page_size: int, disable_overlap_schedule: bool,
) -> int:
    """State slots one running request needs (see the module docstring): 1, 3, 4 or 5."""
    if disable_radix_cache:
        return 1
    if not uses_extra_buffer(architecture=architecture, page_size=page_size,
                             disable_overlap_schedule=disable_overlap_schedule):
        return BASE_RADIX_SLOTS_PER_REQUEST
    return BASE_RADIX_SLOTS_PER_REQUEST + (1 if disable_overlap_schedule else 2)


def requested_state_slots(*, max_mamba_cache_size: int | None, disable_radix_cache: bool,
                          max_running_requests: int | None, attention_dp_size: int) -> int | None:
    """Usable state slots fixed by the flags, else None (the budget's --mamba-full-memory-ratio share sizes them):
    --max-mamba-cache-size, or without the radix cache one a running request, --max-running-requests over the
    attention-DP workers (SGLang 0.5.23's `_handle_max_mamba_cache`, mem_cache/kv_cache_configurator.py)."""
    if max_mamba_cache_size is not None:
        return max_mamba_cache_size
    if disable_radix_cache and max_running_requests is not None:
        return max(1, max_running_requests // attention_dp_size)
    return None
