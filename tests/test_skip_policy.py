"""Which skip reasons CI accepts (tests/skip_policy.py): a missing machine feature, reference tree or optional
package; never a missing dependency or an error turned into a skip."""

from __future__ import annotations

import pytest

from skip_policy import is_allowed


@pytest.mark.parametrize("reason", [
    "needs CUDA", "needs a CUDA device", "needs 2 GPUs", "needs CUDA with Triton, or TRITON_INTERPRET=1 with NumPy",
    "compiles, not interprets", "this torch build has no gloo process groups",
    "no SGLang reference tree (set KVCACHE_REFERENCE_SRC to a folder holding its sources)",
    "no vLLM 0.34.0 reference tree at /tmp/src (vllm/v1/core/kv_cache_planning.py is missing)",
    "could not import 'transformers': No module named 'transformers'", "could not import 'matplotlib': No module named 'matplotlib'",
    "transformers 4.40.0 does not know model_type 'qwen3_next'",
    "transformers 4.57.1 predates 5.15's layer names (linear_attention / full_attention for Mamba and attention)",
])
def test_a_reason_a_cpu_ci_box_has_is_allowed(reason: str) -> None:
    assert is_allowed(reason)


@pytest.mark.parametrize("reason", [
    "could not import 'msgspec': No module named 'msgspec'",
    "could not import 'kvcache.pools': cannot import name 'X'",
    "could not import 'hypothesis': No module named 'hypothesis'",
    "transformers cannot build Qwen3-8B here: KeyError",
    "flaky on this machine", "",
])
def test_any_other_reason_fails_the_run(reason: str) -> None:
    assert not is_allowed(reason)
