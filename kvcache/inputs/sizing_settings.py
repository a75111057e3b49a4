"""SizingSettings: the knobs that size one worker's KV cache, and nothing else.

Read once from ServerArgs. Parallel sizes (TP, PP, attention DP) are deliberately not
here: the configurator reads them only from ParallelState, so overriding the parallel
state changes the layer specs, the runtime reserve and the request cap together.
"""

from __future__ import annotations

from fractions import Fraction

import msgspec

from kvcache.arithmetic import exact_fraction
from kvcache.errors import ConfigError
from kvcache.inputs.server_args import ServerArgs, token_cap_below_one_page
from kvcache.inputs.server_arg_types import HybridSwaMemory
from kvcache.inputs.sglang_ratios import SGLANG_MAMBA_FULL_MEMORY_RATIO, SGLANG_SWA_FULL_TOKENS_RATIO


DEFAULT_PAGE_SIZE = 1  # SGLang 0.5.23's page_size when neither the flag nor the model sets one


def resolved_page_size(requested: int | None, forced: int | None = None) -> int:
    """The page size a worker runs at, decided once: the model's when it forces one (DSA pages at 64,
    kvcache.models.model_page_size), else --page-size, else 1."""
    if forced is not None:
        return forced
    return DEFAULT_PAGE_SIZE if requested is None else requested


def measures_headroom(a: "ServerArgs | SizingSettings") -> bool:
    """--kv-headroom measured, or auto with neither --mem-fraction-static nor --kv-cache-memory given."""
    if a.kv_headroom == "auto":
        return a.mem_fraction_static is None and a.kv_cache_memory is None
    return a.kv_headroom == "measured"


class SizingSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Budget, token and request knobs, with ratios as the exact fractions they were written as."""

    page_size: int = DEFAULT_PAGE_SIZE
    context_length: int | None = None
    allow_long_context: bool = False
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    kv_cache_memory: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    disable_prefill_cuda_graph: bool = False
    disable_decode_cuda_graph: bool = False
    disable_cuda_graph_padding: bool = False  # decode batches between captured sizes run eagerly
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False  # decode requests ride in prefill chunks: the measurement runs that step too
    disable_radix_cache: bool = False
    hybrid_swa_memory: HybridSwaMemory = "auto"  # separate sliding-window pools: the engine's rule, or a flag's
    swa_full_tokens_ratio: Fraction = SGLANG_SWA_FULL_TOKENS_RATIO
    mamba_full_memory_ratio: Fraction = SGLANG_MAMBA_FULL_MEMORY_RATIO
    mamba_ssm_dtype: str = "float32"
    max_mamba_cache_size: int | None = None
    speculative_algorithm: str = "none"
    speculative_num_draft_tokens: int = 0  # tokens one verify step writes (0 without speculative decoding)
    speculative_num_steps: int = 0  # draft steps per verify (0 without speculative decoding)
    speculative_eagle_topk: int = 0  # draft branches per step (0 without speculative decoding)
    enable_post_capture_kv_resize: bool = False
    kv_headroom: str = "auto"
    enable_multimodal: bool | None = None  # None: the engine's default for the architecture
    language_model_only: bool = False

    @classmethod
    def from_server_args(cls, a: ServerArgs, *, forced_page_size: int | None = None) -> "SizingSettings":
        """The knobs of `a`; `forced_page_size` is the page size the (target) model imposes, if any."""
        page_size = resolved_page_size(a.page_size, forced_page_size)
        if below := token_cap_below_one_page(a.max_total_tokens, page_size):
            raise ConfigError(below)
        return cls(
            page_size=page_size, context_length=a.context_length, allow_long_context=a.allow_long_context,
            max_total_tokens=a.max_total_tokens, max_running_requests=a.max_running_requests,
            mem_fraction_static=a.mem_fraction_static, kv_cache_memory=a.kv_cache_memory,
            chunked_prefill_size=a.chunked_prefill_size, cuda_graph_max_bs=a.cuda_graph_max_bs,
            disable_cuda_graph=a.disable_cuda_graph, disable_prefill_cuda_graph=a.disable_prefill_cuda_graph,
            disable_decode_cuda_graph=a.disable_decode_cuda_graph,
            disable_cuda_graph_padding=a.disable_cuda_graph_padding,
            disable_overlap_schedule=a.disable_overlap_schedule,
            enable_mixed_chunk=a.enable_mixed_chunk, disable_radix_cache=a.disable_radix_cache,
            hybrid_swa_memory=a.hybrid_swa_memory, swa_full_tokens_ratio=exact_fraction(a.swa_full_tokens_ratio),
            mamba_full_memory_ratio=exact_fraction(a.mamba_full_memory_ratio),
            mamba_ssm_dtype=a.mamba_ssm_dtype, max_mamba_cache_size=a.max_mamba_cache_size,
            speculative_algorithm=a.speculative_algorithm,
            speculative_num_draft_tokens=a.resolved_speculative_num_draft_tokens if a.speculative else 0,
            speculative_num_steps=a.resolved_speculative_num_steps if a.speculative else 0,
            speculative_eagle_topk=a.resolved_speculative_eagle_topk if a.speculative else 0,
            enable_post_capture_kv_resize=a.enable_post_capture_kv_resize, kv_headroom=a.kv_headroom,
            enable_multimodal=a.enable_multimodal, language_model_only=a.language_model_only,
        )

    def graph_served_batch(self, largest_graph_batch: int) -> int:
        """The largest decode batch a captured graph serves: the largest captured, or none where batches between
        captured sizes run eagerly (--disable-cuda-graph-padding), so any batch may run eagerly."""
        return 0 if self.disable_cuda_graph_padding else largest_graph_batch

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm != "none"

    @property
    def measures_headroom(self) -> bool:
        """Whether the headroom comes from the measured worst-case step (--kv-headroom; auto unless a fraction or a
        KV size was given). Where the pools cannot be resized the eligibility rule still turns it off."""
        return measures_headroom(self)

    def replace(self, **changes: object) -> "SizingSettings":
        return msgspec.structs.replace(self, **changes)
