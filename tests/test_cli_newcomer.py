"""What an operator new to this tool types, from SGLang or vLLM habits, and the one line each gets back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvcache.sizing.worker_sizing as worker_sizing
from app.cli import main
from containers import EngineContainer
from kvcache.errors import DoesNotFitError
from kvcache.byte_units import MiB, parse_bytes
from kvcache.inputs.server_args import ServerArgs
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.models.presets import PRESET_DIR
from kvcache.testing import tiny_model_config


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """Run the CLI, expect `code` and one stderr line; return that line."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_mistyped_command_is_named_with_the_one_meant(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["plna", "--model", "Qwen3-8B", "--gpu", "H200"], capsys)
    assert "unknown command 'plna'" in err and "did you mean `plan`?" in err  # was: "unrecognized arguments: plna --gpu H200"


def test_plan_flags_without_plan_say_they_belong_to_plan(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["--model", "Qwen3-8B", "--gpu", "H200"], capsys)
    assert "--gpu belongs to `plan`" in err and "python -m app plan --gpu" in err


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        (["--max-model-len", "4096"], "--max-model-len is vLLM's knob: add --engine vllm, or with SGLang's rules "
                                      "use --context-length"),
        (["--enforce-eager"], "--enforce-eager is vLLM's name; here use --disable-cuda-graph"),
        (["--host", "0.0.0.0", "--trust-remote-code"], "--host changes nothing this engine sizes: drop it; "
                                                       "--trust-remote-code changes nothing"),
        (["--ep-size", "8"], "--ep-size is not modelled: MoE weights are split over --tp-size"),  # not "did you mean --tp-size?"
        (["--ep", "8"], "--ep is not modelled"),  # not "did you mean --help?"
        (["--gpu-memory-utilization", "0.9"], "with SGLang's rules use --mem-fraction-static"),
        (["--modle", "Qwen3-8B"], "--modle: did you mean --model?"),
        (["--jsn"], "--jsn: did you mean --json?"),
        # pasted from an SGLang launch: not "did you mean --cuda-graph-max-bs?"
        (["--cuda-graph-bs", "1", "2", "4"], "--cuda-graph-bs is a list of batch sizes there; here the largest one "
                                              "sizes the graphs: --cuda-graph-max-bs N"),
        (["--enable-metrics"], "--enable-metrics changes nothing this engine sizes: drop it"),
        # SGLang 0.5.23's per-phase spellings
        (["--cuda-graph-backend-prefill", "disabled"], "here --disable-decode-cuda-graph / --disable-prefill-cuda-graph"),
        (["--attn-dp-size", "2"], "here --dp-size N --enable-dp-attention"),
        (["--cuda-graph-max-bs-prefill", "512"], "--cuda-graph-max-bs-prefill is not modelled"),
        (["--cuda-graph-bs-decode", "1", "2"], "here the largest one sizes the graphs: --cuda-graph-max-bs N"),
        (["--nnodes", "2", "--node-rank", "0"], "--nnodes changes nothing this engine sizes: the plan is per GPU"),
        (["--json-model-override-args", "{}"], "edit a copy of config.json and pass that file with --model"),
        (["--chunked-prefill-size", "-1"], "-1 is SGLang's 'no chunked prefill', not modelled here"),
        (["--cuda-graph-max-bs", "-1"], "--disable-cuda-graph turns the graphs off"),
    ],
)
def test_an_unknown_flag_gets_the_flag_meant(extra: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert hint in refused(["plan", "--gpu", "H200", *extra], capsys)


def test_a_unit_typed_apart_from_its_number_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    assert "a size is one word: 80GiB, not 80 GiB" in refused(["plan", "--gpu-memory", "80", "GB"], capsys)


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["plan", "--gpu", "H200", "--json", *argv]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_sglang_spellings_of_flags_and_values_plan_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    ours = plan_json(["--model", "Llama-3.1-8B-Instruct", "--tp-size", "2", "--kv-cache-dtype", "bfloat16",
                      "--speculative-algorithm", "EAGLE3", "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B"],
                     capsys)
    sglangs = plan_json(["--model-path", "Llama-3.1-8B-Instruct", "--tensor-parallel-size", "2", "--kv-cache-dtype", "bf16",
                         "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", "EAGLE3-LLaMA3.1-Instruct-8B"], capsys)
    assert sglangs["kv_cache_dtype"] == "bfloat16"
    assert sglangs["plan"] == ours["plan"] and sglangs["max_total_num_tokens"] == ours["max_total_num_tokens"]


def test_a_models_config_json_given_to_config_says_to_pass_it_as_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    config = PRESET_DIR / "Qwen3-8B.json"
    err = refused(["plan", "--gpu", "H200", "--config", str(config)], capsys)
    assert "is a model's config.json (it has 'architectures')" in err and f"pass it with --model {config}" in err


def test_a_misspelt_setting_in_a_config_file_names_the_setting_meant(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "server.toml"
    settings.write_text("page-sise = 16\nmodel = 'Qwen3-8B'\n")
    err = refused(["plan", "--gpu", "H200", "--config", str(settings)], capsys)
    assert "unknown settings 'page_sise' (did you mean 'page_size'?), 'model' (a command-line flag only)" in err


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "looks like a Hugging Face repo id, and nothing is downloaded here"),
        ("Qwen3-8b", "not a preset and not a path"),
    ],
)
def test_a_repo_id_or_another_case_of_a_preset_names_that_preset(model: str, says: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["plan", "--gpu", "H200", "--model", model], capsys)
    preset = model.rsplit("/", 1)[-1].replace("8b", "8B")
    assert says in err and f"the shipped preset '{preset}' has that name: --model {preset}" in err


def test_kv_cache_memory_suggestions_are_sizes_a_person_types_and_they_plan(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--json"]

    def request_cap(kv_cache_memory: str) -> tuple[int | None, list[str]]:
        """SGLang 0.5.23 runs a pool shorter than one request: the per-request cap and what would lift it."""
        assert main([*base, "--kv-cache-memory", kv_cache_memory]) == 0
        report = json.loads(capsys.readouterr().out)
        fixes = [f for n in report["capacity_notes"] if n["cap"] == "request_length" for f in n["fixes"]]
        return report["request_token_cap"], fixes

    cap, fixes = request_cap("1.5GiB")
    assert cap is not None and cap < 131_072
    (least,) = [s.split()[1] for s in fixes if s.startswith("--kv-cache-memory")]
    assert least.endswith("MiB")  # was 18259902464: the bytes, to be copied digit by digit
    assert request_cap(least)[0] is None
    assert request_cap(f"{parse_bytes(least) // MiB - 1}MiB")[0] is not None  # the least whole MiB


def test_no_memory_limit_above_what_the_host_has_is_suggested(monkeypatch: pytest.MonkeyPatch) -> None:
    def memory_limits(host: int | None) -> list[int]:
        monkeypatch.setattr(worker_sizing, "host_memory_bytes", lambda: host)
        engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "kv_cache_memory": 48 * MiB}),
                                 model_config=tiny_model_config())
        engine.memory_probe.override(FixedMemoryProbe(total_bytes=32 * MiB))
        with pytest.raises(DoesNotFitError) as info:
            engine.engine().bootstrap()
        engine.shutdown_resources()
        return [parse_bytes(s.split()[1]) for s in info.value.suggestions if s.startswith("--memory-limit")]

    (needed,) = memory_limits(None)  # a host of unknown size: the limit that keeps --kv-cache-memory
    assert memory_limits(needed) == [needed]
    assert memory_limits(needed - MiB) == []  # it would be refused: "more than this host has"


def test_a_negative_size_is_not_taken_for_a_missing_value(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["plan", "--gpu", "H200", "--kv-cache-memory", "-1GB"], capsys)
    assert "'-1GB' after --kv-cache-memory is read as a flag; no value here is negative" in err


@pytest.mark.parametrize(("extra", "flag"), [(["--memory-limit", "64GB"], "--memory-limit"), (["--device", "cuda"], "--device")])
def test_plan_refuses_what_only_bootstrap_uses(extra: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["plan", "--gpu", "H200", *extra], capsys)  # was exit 0, the flag silently ignored
    assert f"{flag} is for bootstrap (this machine); plan sizes the card --gpu or --gpu-memory names: drop {flag}" in err


def test_bootstrap_on_meta_points_to_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert "use plan --gpu NAME or plan --gpu-memory SIZE" in refused(["--device", "meta"], capsys)


def test_a_one_layer_pool_reads_as_one_layer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H200", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model", "EAGLE3-LLaMA3.1-Instruct-8B"]) == 0
    pools = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pool ")]
    assert "full: 32 layers x 4,096 B/token" in pools[0] and "full: 1 layer x 4,096 B/token" in pools[1]


def test_weights_larger_than_the_host_ask_for_a_bigger_host_not_a_refused_limit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("app.worker_refusals.host_memory_bytes", lambda: 16 << 30)
    # the CPU probe counts this process's RSS growth, which other tests in the run (and the host's load) move
    monkeypatch.setattr("kvcache.memory.memory_probe._resident_bytes", lambda: 0)
    monkeypatch.setattr("kvcache.memory.memory_probe._host_available_bytes", lambda: None)  # and what it has free
    assert main(["--model", "Qwen3-Next-80B-A3B-Thinking", "--device", "cpu", "--json"]) == 3
    (suggestion,) = json.loads(capsys.readouterr().out)["error"]["suggestions"]
    # was "--memory-limit 151968MiB or more", which this host refuses ("more than this host has"); now the limit that
    # holds the 148.4 GiB of weights, the runtime's reserve and one full-length request, and the host's size
    assert suggestion.startswith("a host with more memory: --memory-limit ")
    assert int(suggestion.split()[6].removesuffix("MiB")) > 151968
    assert suggestion.endswith("MiB (ServerArgs.memory_limit from Python) is the least that holds the weights, the "
                               "runtime's reserve and one full-length "
                               "request; this host has 16384MiB")


def test_weights_that_do_not_fit_a_plan_name_the_card_not_the_meta_device(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["plan", "--model", "DeepSeek-V3", "--gpu", "L4"], capsys, code=3)
    assert "do not fit in the 21.89 GiB (23,501,930,496 B) free on the card" in err


def test_a_bad_choice_in_a_config_file_lists_the_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "server.toml"
    settings.write_text('kv-cache-dtype = "fp9"\n')
    err = refused(["plan", "--gpu", "H200", "--config", str(settings)], capsys)
    assert (f"config file {settings}: kv-cache-dtype = 'fp9' is refused (--kv-cache-dtype, ServerArgs.kv_cache_dtype): "
            "Invalid enum value 'fp9' (--kv-cache-dtype: one of auto, bfloat16, bf16,") in err  # the flag, not `$.` paths
    settings.write_text('kv-cache-dtype = "fp8"\n')  # vLLM's spelling, under SGLang's rules
    assert "--kv-cache-dtype fp8 is vLLM's spelling: add --engine vllm, or with SGLang's rules use --kv-cache-dtype " \
           "fp8_e4m3" in refused(["plan", "--gpu", "H200", "--config", str(settings)], capsys)


def test_a_plan_below_one_full_context_says_why_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    # Mistral-7B-v0.1 slides a 4,096-token window on every layer: sized as a window pool (SGLang 0.5.23 keeps it in
    # one full pool; --enable-hybrid-swa-memory asks for the window pool), 9,339 tokens on an L4 plan (exit 0), which
    # one 32,768-token request fits only if its tokens outside the window are freed
    assert main(["plan", "--model", "Mistral-7B-v0.1", "--gpu", "L4", "--enable-hybrid-swa-memory",
                 "--kv-headroom", "fraction"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("max total tokens")]
    assert line == ("max total tokens    9,339  (below the 32,768-token context: every layer attends a window, so a "
                    "request keeps only its last window of tokens; an engine that keeps every token serves requests "
                    "of at most 9,339 tokens)")


def test_presets_read_as_english_with_grouped_digits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["EAGLE3-LLaMA3.1-Instruct-8B"].endswith("  1 layer   ctx   2,048")  # was "1 layers  ctx 2048"
    assert lines["DeepSeek-V3"].endswith(" 61 layers  ctx 163,840")


@pytest.mark.parametrize(("argv", "hint"), [
    (["Qwen3-8B", "--gpu", "H200"], "unknown command 'Qwen3-8B'"),  # was: unrecognized arguments: Qwen3-8B --gpu H200
    (["plan", "Qwen3-8B", "--gpu", "H200"], "Qwen3-8B follows no flag"),  # vllm serve's habit: the model bare
])
def test_a_bare_model_name_is_passed_with_model(argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(argv, capsys)
    assert hint in err and "a model is passed with --model Qwen3-8B" in err


def test_sglangs_yaml_config_is_named_as_yaml_not_bad_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "server.yaml"
    settings.write_text("tp-size: 2\n")
    err = refused(["plan", "--gpu", "H200", "--config", str(settings)], capsys)
    assert "is YAML (SGLang's --config format), which is not read here" in err  # was: "is not valid JSON: Expecting value"


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", ""], "--model is empty: give a preset ("),  # was "no model config at config.json"
    (["--config", ""], "--config is empty"),  # was exit 0 (ignored), then 'cannot read config file .: Is a directory'
    ([""], "'' follows no flag (see"),  # was "a model is passed with --model " (the cwd exists)
])
def test_an_empty_value_is_named_as_empty(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert says in refused(["plan", "--gpu", "H200", *argv], capsys)


def test_the_state_slot_cap_is_named_only_when_it_is_what_limits_running_requests(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-Next: with --max-mamba-cache-size 20 (5 slots a request) the state slots cap running requests at 4,
    which is named; with NEXTN the speculative default of 48 limits first, so naming the state cap of 130
    would mislead."""
    assert main(["plan", "--model", "Qwen3-Next-80B-A3B-Thinking", "--gpu", "H200", "--tp-size", "8",
                 "--max-mamba-cache-size", "20"]) == 0
    assert "max running reqs    4  (state slots cap requests at 4)" in capsys.readouterr().out
    assert main(["plan", "--model", "Qwen3-Next-80B-A3B-Thinking", "--gpu", "H200", "--tp-size", "2",
                 "--speculative-algorithm", "NEXTN"]) == 0
    running = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("max running reqs"))
    assert running == "max running reqs    48"
