"""Whether a worker may size its KV pools after CUDA-graph capture: a typed rule, no environment variable.

The rule follows SGLang 0.5.23 (`post_capture_kv_sizing_planned` and the runner's
`is_post_capture_kv_active`), narrowed to what this engine can resize: one target
worker on CUDA, pools that hold every token (full attention or MLA), no draft pools
built by another worker, no per-request state pools, no MLA latents in FP4.
When it holds, the plan may start from a higher `mem_fraction_static` (the graph and
activation reserve is left out, see `post_capture_reserve_mib`), because the resize
trims the pools back to the measured free memory after capture. Measured headroom
(`--kv-headroom`, kvcache.runtime.measured_headroom) is the same resize with the headroom
taken from the engine's measured worst-case step instead of the fraction.
"""

from __future__ import annotations

from fractions import Fraction

import msgspec

from kvcache.inputs.dtypes import KVCacheDtype
from kvcache.sizing.pool_layout import CacheLayout
from kvcache.sizing.runtime_reserve import parallel_reserve_mib
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.sizing_settings import SizingSettings, measures_headroom

POST_CAPTURE_FLOOR_MIB = 1536  # SGLang 0.5.23's reserve when post-capture sizing is planned


class PostCaptureEligibility(msgspec.Struct, frozen=True, kw_only=True):
    """The rule's answer, with the reason an operator reads when it is off."""

    active: bool
    reason: str
    measured: bool = False  # the headroom comes from the measured worst-case step, not the fraction
    not_measured: str = ""  # where the headroom would be measured but the engine runs a step it does not: why


def post_capture_eligibility(
    *, server_args: ServerArgs | SizingSettings, device_type: str, is_draft_worker: bool, layout: CacheLayout,
    kv_cache_dtype: KVCacheDtype, multimodal_on: bool = False,
) -> PostCaptureEligibility:
    """Whether the post-capture resize runs for this worker, and why (not). With the model's multimodal side on
    (`multimodal_on`) the headroom is never measured: the worst-case step runs no vision encoder, so the engine's
    cut fraction keeps its vision headroom (the resize still runs when --enable-post-capture-kv-resize asks)."""
    a = server_args
    kinds = {g.spec.pool_kind for g in layout.kv_groups}
    blockers = (
        (not (a.enable_post_capture_kv_resize or measures_headroom(a)),
         "off (turn it on with --enable-post-capture-kv-resize or --kv-headroom measured)"),
        (device_type != "cuda", f"needs a CUDA device for its virtual-memory pools, not {device_type}"),
        (is_draft_worker, "a draft worker's pools follow the target's token indices"),
        (a.kv_cache_memory is not None, "--kv-cache-memory fixes the KV budget"),
        (a.speculative, "draft pools are built by another worker; resize with --speculative-algorithm none"),
        (layout.state is not None, "recurrent-state pools are sized per request, not per token"),
        (any(g.paired_with_full for g in layout.kv_groups), "a paired sliding-window pool needs its SWA allocator resized"),
        ("mla" in kinds and kv_cache_dtype.scale_group > 0, "MLA latents in FP4 (data plus scales) are not resized"),
        (not layout.kv_groups, "no per-token KV pool to resize"),
    )
    for blocked, reason in blockers:
        if blocked:
            return PostCaptureEligibility(active=False, reason=reason)
    why = _why_not_measured(a, multimodal_on)
    if measures_headroom(a) and why:
        if a.enable_post_capture_kv_resize:
            return PostCaptureEligibility(active=True, reason=f"on: pools shrink after CUDA-graph capture; {why}",
                                          not_measured=why)
        return PostCaptureEligibility(active=False, reason=why, not_measured=why)
    if measures_headroom(a):
        return PostCaptureEligibility(active=True, measured=True, reason=(
            "measured: after CUDA-graph capture the pools keep what the worst-case step left free, less a margin"))
    return PostCaptureEligibility(active=True, reason="on: pools shrink to the memory free after CUDA-graph capture")


def _why_not_measured(a: ServerArgs | SizingSettings, multimodal_on: bool) -> str:
    """Why the engine runs a step the measured worst-case steps do not ("" when they cover it): then the
    fraction keeps the headroom. --enable-mixed-chunk's steps are measured (app.forward.worst_case's mixed_chunk)."""
    if multimodal_on:
        return ("not measured: the worst-case step runs no vision encoder, so with the multimodal side on the "
                "engine's cut fraction keeps the headroom (--language-model-only measures)")
    return ""


def is_post_capture_kv_active(
    *, server_args: ServerArgs | SizingSettings, device_type: str, is_draft_worker: bool, layout: CacheLayout,
    kv_cache_dtype: KVCacheDtype, multimodal_on: bool = False,
) -> bool:
    """True when this worker's pools are built resizable and shrunk after capture."""
    return post_capture_eligibility(
        server_args=server_args, device_type=device_type, is_draft_worker=is_draft_worker, layout=layout,
        kv_cache_dtype=kv_cache_dtype, multimodal_on=multimodal_on,
    ).active


def post_capture_reserve_mib(*, tp_size: int, pp_size: int) -> Fraction:
    """The reserve a derived mem_fraction_static keeps when the resize runs (SGLang 0.5.23):
    1536 MiB plus tp * pp / 8 GiB, without the activation and graph terms or the 10 GiB floor."""
    return Fraction(POST_CAPTURE_FLOOR_MIB) + parallel_reserve_mib(tp_size, pp_size)
