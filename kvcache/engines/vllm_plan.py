"""What vLLM 0.34.0 makes of a model's KV cache: its block size, KV cache groups, blocks and max concurrency.

Pure integer math over the project's layer specs, following vLLM 0.34.0's planner
(`vllm/v1/core/kv_cache_planning.py`: get_kv_cache_groups, unify_kv_cache_spec_page_size,
_get_kv_cache_groups_uniform_page_size, get_kv_cache_configs; `vllm/v1/core/kv_cache_utils.py`:
get_max_concurrency_for_kv_cache_config; `vllm/platforms/interface.py`: _align_hybrid_block_size),
for the CUDA defaults `kvcache.engines.vllm_rules` states (a rank's layers as vLLM's planner sees them:
`kvcache.engines.vllm_layers`):

- every attention layer takes `block_size` tokens per block (64 unless --block-size); next to
  Mamba / linear-attention layers the block grows until one attention page holds a whole
  recurrent state, and the state page is padded to the attention page;
- layers with one spec form one group; one kind with different sizes forms one group too;
  mixed kinds (full + sliding window, attention + Mamba) unify their page sizes (a smaller page
  takes more tokens per block, or is padded) and split into groups of equal layer count, so
  one block id holds the same bytes in every group;
- a sparse-attention MLA layer (DeepSeek-V3.2, GLM-5) is two caches of one block size, the indexer's
  key and the latent (`sparse_mla_layers`, rules in vllm_rules), so every layer of such a model falls
  in one group; its kernels take blocks in multiples of 64 tokens;
- num_blocks = available bytes // bytes of one block across the largest group (the null
  block included, as vLLM counts it); a request of max_model_len takes, in each group,
  the blocks its spec needs (all its tokens for full attention; the window plus the tokens
  in flight, plus one, for a sliding window; for Mamba one state, or with prefix caching (mamba_cache_mode
  "align", vLLM's default) two states and the layer's prefill checkpoint blocks); max concurrency is
  num_blocks / those blocks, as vLLM prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import lcm

from kvcache.engines import vllm_rules
from kvcache.engines.vllm_layers import VllmLayer, VllmSettings, vllm_layers
from kvcache.arithmetic import align_up, ceil_div
from kvcache.errors import BudgetBelowOneRequestError, UnsupportedModelError
from kvcache.sizing.layer_specs import LayerPlacement, MLASpec

ATTENTION_KINDS = ("full", "sliding", "chunked", "mla")


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmGroup:
    """One KV cache group: layers sharing one block table."""

    kind: str
    window: int
    block_size: int
    layer_pages: tuple[int, ...]  # the page of each layer in the group
    blocks_per_request: int

    @property
    def bytes_per_block(self) -> int:
        return sum(self.layer_pages)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmPlan:
    """vLLM's answer for one rank: its groups, the bytes of one block id, how many it has, what a request takes."""

    version: str
    block_size: int  # the attention block size after vLLM's hybrid alignment
    groups: tuple[VllmGroup, ...]
    bytes_per_block: int
    num_blocks: int  # vLLM's num_gpu_blocks (the null block among them)
    blocks_per_request: int
    available_bytes: int
    max_model_len: int

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len the cache holds at once, as vLLM logs it ('%.2fx')."""
        return self.num_blocks / self.blocks_per_request

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM's 'GPU KV cache size: N tokens': max concurrency times max_model_len."""
        return int(self.max_concurrency * self.max_model_len)

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs in the groups that hold every token (full attention, MLA), as the SGLang-rules
        plan counts its pools that do (MemoryPoolConfig.bytes_per_token)."""
        return sum(g.bytes_per_block // g.block_size for g in self.groups if g.kind in ("full", "mla"))


def resolve_block_size(layers: tuple[VllmLayer, ...], settings: VllmSettings) -> tuple[int, int]:
    """(attention block size, padded Mamba page or 0), as vLLM's platform aligns a hybrid model
    (platforms/interface.py update_block_size_for_backend): the block rounds up to a multiple of the
    kernel block (128 for MLA; in align mode also of the layers' prefill checkpoint alignment) until one
    attention page holds the largest recurrent state; that state's page is padded to the attention page."""
    size = settings.block_size or vllm_rules.DEFAULT_BLOCK_SIZE
    attention = [x for x in layers if x.kind in ATTENTION_KINDS]
    states = [x.state_bytes for x in layers if x.kind == "mamba"]
    if not attention or not states:
        return size, 0
    uses_mla = any(x.kind == "mla" for x in attention)
    kernel = vllm_rules.FLASH_MLA_KERNEL_BLOCK if uses_mla else vllm_rules.FLASH_ATTN_KERNEL_BLOCK
    align = max(kernel, size, vllm_rules.MLA_MAMBA_BLOCK_ALIGNMENT if uses_mla else 0)
    if settings.mamba_cache_mode == "align":
        align = lcm(align, settings.mamba_checkpoint.alignment or 1)
    token_bytes = attention[0].token_bytes
    needed = align_up(align * ceil_div(max(states), align * token_bytes), kernel)
    size = max(size, needed)
    return size, size * token_bytes


def _with_block_size(layers: tuple[VllmLayer, ...], block_size: int, mamba_page: int,
                     hybrid_manager: bool, settings: VllmSettings) -> list[VllmLayer]:
    """Each layer's spec as vLLM builds it; without the hybrid manager, local layers become full attention. A Mamba
    layer's block spans max_model_len tokens, or the attention block in "align" mode (MambaModelConfig's
    mamba_block_size): it sizes nothing here, the report states it."""
    mamba_block = block_size if settings.mamba_cache_mode == "align" else settings.max_model_len
    out = []
    for x in layers:
        if x.kind == "mamba":
            out.append(replace(x, block_size=mamba_block, padded_page=mamba_page if mamba_page > x.state_bytes else 0))
        elif not hybrid_manager and x.kind in ("sliding", "chunked"):
            out.append(replace(x, kind="full", window=0, block_size=block_size))
        else:
            out.append(replace(x, block_size=block_size))
    return out


def _unify_pages(layers: list[VllmLayer]) -> list[VllmLayer]:
    """Give every layer the largest page: more tokens per block where the page divides it, else padding."""
    largest = max(x.page_bytes for x in layers)
    out = []
    for x in layers:
        page = x.page_bytes
        if page == largest:
            out.append(x)
        elif x.kind != "mamba" and largest % page == 0:
            out.append(replace(x, block_size=x.block_size * (largest // page)))
        elif x.kind == "mla":
            raise UnsupportedModelError(
                f"--engine vllm: an MLA page of {page} bytes does not divide the largest page of {largest} "
                "bytes; vLLM 0.34.0 cannot unify them (kv_cache_planning.py unify_kv_cache_spec_page_size)"
            )
        else:
            out.append(replace(x, padded_page=largest))
    return out


def _group(kind_layers: list[VllmLayer], settings: VllmSettings) -> VllmGroup:
    first = kind_layers[0]
    return VllmGroup(
        kind=first.kind, window=first.window, block_size=first.block_size,
        layer_pages=tuple(x.page_bytes for x in kind_layers),
        blocks_per_request=max(x.blocks_per_request(settings) for x in kind_layers),
    )


def _one_type(layers: list[VllmLayer]) -> bool:
    """vLLM's UniformTypeKVCacheSpecs test: one block size and one kind (one window; one state page)."""
    first = layers[0]
    same = {(x.kind, x.block_size, x.window, x.page_bytes if x.kind == "mamba" else 0) for x in layers}
    return len(same) == 1 and (first.kind != "mamba" or first.padded_page == layers[-1].padded_page)


def kv_cache_groups(layers: list[VllmLayer], settings: VllmSettings) -> tuple[VllmGroup, ...]:
    """vLLM's KV cache groups for one model's layers (get_kv_cache_groups, layer-outer layout)."""
    if not layers:
        return ()
    if _one_type(layers):
        return (_group(layers, settings),)
    unified = _unify_pages(layers)
    buckets: dict[VllmLayer, list[VllmLayer]] = {}
    for x in unified:
        buckets.setdefault(x, []).append(x)
    sizes = [len(b) for b in buckets.values()]
    # the smaller layer count is the group size, unless the largest is under 1.5 times it (less padding)
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for bucket in buckets.values():
        count = ceil_div(len(bucket), group_size)
        groups.extend(_group(bucket[i::count], settings) for i in range(count))
    return tuple(groups)


def _longest_fitting_len(specs: list[VllmLayer], settings: VllmSettings, blocks: int) -> int:
    """The largest max_model_len whose one request takes at most `blocks` blocks (0: not even one token),
    by bisection as vLLM's estimate_max_model_len does."""
    def fits(length: int) -> bool:
        groups = kv_cache_groups(specs, replace(settings, max_model_len=length))
        return sum(g.blocks_per_request for g in groups) <= blocks
    low, high = 0, settings.max_model_len
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def plan_vllm(placements: tuple[LayerPlacement, ...], layer_kinds: tuple[str, ...], *,
              available_bytes: int, settings: VllmSettings) -> VllmPlan:
    """vLLM's block plan for `available_bytes` of KV memory; BudgetBelowOneRequestError where vLLM refuses
    to start (fewer blocks, the null block aside, than one request of max_model_len needs)."""
    layers = vllm_layers(placements, layer_kinds)
    block_size, mamba_page = resolve_block_size(layers, settings)
    vllm_rules.check_sparse_mla_block_size(
        any(isinstance(p.spec, MLASpec) and p.spec.index_head_dim for p in placements), block_size)
    specs = _with_block_size(layers, block_size, mamba_page, not vllm_rules.hybrid_manager_disabled(layer_kinds),
                             settings)
    groups = kv_cache_groups(specs, settings)
    bytes_per_block = max(g.bytes_per_block for g in groups)
    per_request = sum(g.blocks_per_request for g in groups)
    plan = VllmPlan(
        version=vllm_rules.VLLM_VERSION, block_size=block_size, groups=groups, bytes_per_block=bytes_per_block,
        num_blocks=max(available_bytes, 0) // bytes_per_block, blocks_per_request=per_request,
        available_bytes=available_bytes, max_model_len=settings.max_model_len,
    )
    usable_blocks = max(available_bytes - bytes_per_block, 0) // bytes_per_block  # the null block is kept back
    if usable_blocks < per_request:
        longest = _longest_fitting_len(specs, settings, usable_blocks)
        room = (f"{usable_blocks:,} fit besides the null block" if available_bytes > 0 else
                "the memory vLLM may use leaves nothing for them after the weights and activations")
        raise BudgetBelowOneRequestError(
            f"vLLM {plan.version} would refuse to start: one request of max_model_len {settings.max_model_len} "
            f"needs {per_request:,} blocks of {bytes_per_block:,} B, and {room}",
            needed_bytes=(per_request + 1) * bytes_per_block, available_bytes=max(available_bytes, 0),
            suggestions=(f"--max-model-len {longest} (the longest that fits, as vLLM estimates it)",) if longest else (),
        )
    return plan
