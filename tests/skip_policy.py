"""A skipped test fails the run unless its reason is one a CPU CI box legitimately has.

A skip that should not happen (a broken import turned into `importorskip`, a reference test that
silently stopped finding its data, an exception caught and skipped) would let CI pass with the
test never run. conftest.py registers `pytest_runtest_makereport` from here: a skip whose reason
matches none of ALLOWED_SKIP_REASONS is reported as a failure naming the reason.

To allow a new reason, add a regular expression to ALLOWED_SKIP_REASONS (matched with re.match,
so from the start of the reason) with a comment saying why a CI machine may lack it. Allow only a
missing machine feature (CUDA, Triton, gloo), a reference tree outside the project, or a package
that is not a dependency of the project (pyproject's [project] and [test] lists); never an error.
"""

from __future__ import annotations

import re
from typing import Any, Generator

import pytest

# The project's own dependencies: a test skipping because one of these cannot be imported is broken.
REQUIRED_PACKAGES = ("torch", "msgspec", "dependency_injector", "pytest", "pytest_mock", "hypothesis", "kvcache",
                     "app", "containers")

ALLOWED_SKIP_REASONS = (
    # the machine: no GPU, no Triton compiler, a torch build without gloo
    r"needs (CUDA|a CUDA device|\d+ (CUDA devices|GPUs)|Triton|NVIDIA|a GPU)",
    r"compiles, not interprets",
    r"this torch build has no gloo",
    # reference engines' source trees (SGLang, vLLM) live outside the project, fetched by hand
    r"no (SGLang|vLLM)( [\w.]+)? reference tree",
    # an optional package, not a dependency (transformers, triton, numpy, matplotlib, cuda-bindings, ...)
    r"could not import '(?!(%s)[.']).*'" % "|".join(REQUIRED_PACKAGES),
    r"transformers [\w.+-]+ does not know model_type",
    r"transformers [\w.+-]+ builds no causal LM for",
    # a config saved in transformers 5.15's layer names (tests/model_corpus/*-transformers5.json), older releases refuse
    r"transformers [\w.+-]+ predates 5\.15's layer names",
)
_ALLOWED = re.compile("|".join(f"(?:{r})" for r in ALLOWED_SKIP_REASONS))


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason pytest gives for a skipped report (`Skipped: ` stripped)."""
    longrepr: Any = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def is_allowed(reason: str) -> bool:
    return _ALLOWED.match(reason) is not None


def fail_a_skip_not_allowed(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skipped report whose reason is not allowed into a failure that names the reason."""
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        if not is_allowed(reason):
            report.outcome = "failed"
            report.longrepr = (f"skipped for a reason CI does not allow: {reason!r} "
                               "(tests/skip_policy.py lists the allowed ones and how to add one)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A test skipped in setup or call (skipif marks, pytest.skip, importorskip inside the test)."""
    outcome = yield
    fail_a_skip_not_allowed(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """A whole module skipped while collecting (a module-level importorskip or pytest.skip)."""
    outcome = yield
    fail_a_skip_not_allowed(outcome.get_result())
