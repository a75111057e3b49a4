"""Runtime after start-up: whether and how the KV pools shrink once CUDA graphs are captured (pure)."""

from kvcache.runtime.eligibility import (
    PostCaptureEligibility, is_post_capture_kv_active, post_capture_eligibility, post_capture_reserve_mib,
)
from kvcache.runtime.resize import (
    PostCaptureKVResize, compute_post_capture_kv_resize, post_capture_headroom_bytes, resized_plan_request,
)

__all__ = [
    "PostCaptureEligibility", "PostCaptureKVResize", "compute_post_capture_kv_resize", "is_post_capture_kv_active",
    "post_capture_eligibility", "post_capture_headroom_bytes", "post_capture_reserve_mib", "resized_plan_request",
]
