"""SGLang 0.5.23's defaults for hybrid state slots and speculative decoding, and where the CLI applies them."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from containers import EngineContainer
from kvcache.models.presets import load_model_config
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.speculative_defaults import default_draft_shape, default_max_running_requests, with_speculative_defaults
from kvcache.sizing.state_slots import state_slots_per_request


@pytest.mark.parametrize(
    ("architecture", "radix", "page", "overlap", "slots"),
    [
        ("Qwen3NextForCausalLM", True, 1, True, 5),  # 3 + 2 ping-pong tracking slots
        ("NemotronHForCausalLM", True, 64, True, 5),
        ("Qwen3NextForCausalLM", True, 64, False, 4),  # pages > 1 keep the extra buffer, one tracking slot
        ("Qwen3NextForCausalLM", True, 1, False, 3),  # no overlap, page 1: no_buffer
        ("JambaForCausalLM", True, 1, True, 3),  # no extra-buffer support: base 3
        ("Qwen3NextForCausalLM", False, 1, True, 1),  # no radix cache: the running state only
    ],
)
def test_state_slots_per_request(architecture: str, radix: bool, page: int, overlap: bool, slots: int) -> None:
    assert state_slots_per_request(architecture=architecture, disable_radix_cache=not radix, page_size=page,
                                   disable_overlap_schedule=not overlap) == slots


@pytest.mark.parametrize(
    ("algorithm", "architecture", "shape"),
    [("EAGLE3", "LlamaForCausalLM", (5, 4, 8)), ("EAGLE", "LlamaForCausalLM", (5, 4, 8)),
     ("NEXTN", "DeepseekV3ForCausalLM", (3, 1, 4)), ("EAGLE", "Qwen2ForCausalLM", (3, 1, 4)),
     ("STANDALONE", "LlamaForCausalLM", (3, 1, 4)), ("EAGLE", "Grok1ForCausalLM", (5, 4, 8))],
)
def test_draft_shape_by_target(algorithm: str, architecture: str, shape: tuple[int, int, int]) -> None:
    assert default_draft_shape(algorithm, architecture) == shape


def test_speculative_defaults_fill_only_what_was_not_given() -> None:
    eagle = ServerArgs(speculative_algorithm="EAGLE3", speculative_draft_model="d")
    filled = with_speculative_defaults(eagle, "LlamaForCausalLM")
    assert (filled.speculative_num_steps, filled.speculative_eagle_topk, filled.speculative_num_draft_tokens) == (5, 4, 8)
    assert filled.max_running_requests is None  # 48 is the planner's default, after the reserve (below)
    kept = with_speculative_defaults(eagle.replace(speculative_num_steps=2), "LlamaForCausalLM")
    assert (kept.speculative_num_steps, kept.speculative_eagle_topk) == (2, None)
    assert kept.resolved_speculative_num_draft_tokens == 3  # a chain: steps + 1
    assert with_speculative_defaults(ServerArgs(), "LlamaForCausalLM") == ServerArgs()


@pytest.mark.parametrize(("given", "algorithm", "cap"), [(None, "EAGLE3", 48), (None, "NEXTN", 48), (8, "EAGLE", 8),
                                                         (None, "none", None), (300, "none", 300)])
def test_running_requests_default_to_48_with_a_draft(given: int | None, algorithm: str, cap: int | None) -> None:
    assert default_max_running_requests(given, algorithm) == cap


def test_the_cli_plans_eagle3_with_sglangs_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B", "--gpu", "H100-80GB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_running_requests"] == 48
    assert report["plan"]["req_to_token_row_width"] == report["context_length"] + 4 + 8  # SGLang's 4, and 8 draft tokens verified
    # SGLang 0.5.23 adds no draft reserve, and the graph batch in the reserve stays 256 (48 is set later): 0.830
    assert report["mem_fraction_static"] == 0.830


def test_the_container_sizes_with_the_draft_shape_of_its_target() -> None:
    engine = EngineContainer(server_args=ServerArgs(speculative_algorithm="EAGLE3", device="cpu",
                                                    speculative_draft_model="EAGLE3-LLaMA3.1-Instruct-8B"),
                             model_config=load_model_config("Llama-3.1-8B-Instruct"))
    assert engine.target.configurator().settings.speculative_num_draft_tokens == 8  # (5, 4, 8) for a Llama target
    assert engine.server_args().speculative_num_draft_tokens is None  # what the user gave is kept as given
    engine.shutdown_resources()
