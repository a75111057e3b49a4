"""The CLI's flags come from ServerArgs: names, bounds, choices and help; sizes read as users type them."""

from __future__ import annotations

import json
from pathlib import Path

from typing import Any

import msgspec
import pytest
import torch

import app.cli as cli
import kvcache.memory.memory_probe as memory_probe
from app.cli import build_parser, main
from app.server_args_flags import server_args_fields
from containers import EngineContainer
from kvcache.byte_units import GiB, MiB, parse_bytes
from kvcache.errors import ConfigError, DoesNotFitError
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.settings_file import server_args_from_file
from kvcache.testing import tiny_model_config


def test_every_server_args_field_has_its_flag_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    fields = {f.name for f in msgspec.structs.fields(ServerArgs)}
    assert {f.field for f in server_args_fields()} == fields
    assert all(f.description for f in server_args_fields()), "each ServerArgs field needs msgspec.Meta(description=...)"
    assert main(["bootstrap", "--help"]) == 0
    help_text = capsys.readouterr().out
    for name in fields:  # vLLM's knobs only where --engine vllm has a use for them: plan
        assert ("--" + name.replace("_", "-") in help_text) == (name not in cli.VLLM_ONLY)
    assert "cap on KV tokens" in help_text and "80 * 2^30 bytes" in help_text
    assert main(["plan", "--help"]) == 0  # plan sizes a named card: no host --memory-limit, no --device
    plan_help = capsys.readouterr().out
    assert all(("--" + name.replace("_", "-") in plan_help) == (name not in cli.BOOTSTRAP_ONLY_FIELDS) for name in fields)


def test_flags_decode_to_the_server_args_a_config_file_would_give(tmp_path: Path) -> None:
    argv = ["bootstrap", "--page-size", "16", "--kv-cache-memory", "20GB", "--memory-limit", "512MiB",
            "--swa-full-tokens-ratio", "0.5", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache",
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model", "x", "--tp-size", "2"]
    from_flags = cli.server_args_from(build_parser().parse_args(argv))
    cfg = tmp_path / "args.json"
    cfg.write_text(json.dumps({"page-size": 16, "kv_cache_memory": 20 * GiB, "memory_limit": 512 * MiB,
                               "swa_full_tokens_ratio": 0.5, "kv_cache_dtype": "fp8_e4m3", "disable_radix_cache": True,
                               "speculative_algorithm": "EAGLE3", "speculative_draft_model": "x", "tp_size": 2}))
    assert from_flags == server_args_from_file(cfg)
    assert cli.server_args_from(build_parser().parse_args(["plan", "--gpu", "H200"])) == ServerArgs()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GB", 80 * GiB), ("80GiB", 80 * GiB), ("80G", 80 * GiB), ("80gb", 80 * GiB), ("80 GiB", 80 * GiB),
     ("141GB", 141 * GiB), ("1.5GiB", 3 * GiB // 2), ("0.5TB", 512 * GiB), ("512MiB", 512 * MiB), ("512M", 512 * MiB),
     ("4096", 4096), ("4096B", 4096), ("1K", 1024)],
)
def test_sizes_read_as_users_type_them(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "80GBs", "eighty", "-80GB", "8e10", "80 G B", "0x50", "1,000", "80iB",
                                  "1.5", "inf", "nan", "80XB"])
def test_anything_else_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


@pytest.mark.parametrize("card", ["80GB", "80GiB", "80G"])
def test_gpu_memory_spellings_plan_the_same_card(card: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu-memory", card, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total_memory_bytes"] == 80 * GiB


@pytest.mark.parametrize("card", ["80GBs", "80 gigs", "-1GB", "eighty", "80", "1e11", "1000000PiB"])
def test_gpu_memory_refuses_anything_else_with_exit_2(card: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", f"--gpu-memory={card}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcache: error: --gpu-memory")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--page-size", "0", "expected an integer >= 1 and <= 2147483647, got '0'"),
        ("--page-size", "1.5", "expected an integer, got '1.5'"),
        ("--cuda-graph-max-bs-decode", "-1", "expected an integer >= 0"),
        ("--mem-fraction-static", "1", "expected a number > 0 and < 1, got '1'"),
        ("--mem-fraction-static", "inf", "expected a finite number"),
        ("--swa-full-tokens-ratio", "0", "expected a number > 0 and <= 1"),
        ("--kv-cache-memory", "0GB", "expected a size >= 1"),
        ("--kv-cache-memory", "lots", "cannot read 'lots' as a size"),
        ("--speculative-algorithm", "MEDUSA", "invalid choice: 'MEDUSA'"),
        ("--device", "tpu", "invalid choice: 'tpu'"),
    ],
)
def test_bounds_and_choices_come_from_server_args(flag: str, value: str, message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bootstrap", flag, value]) == 2  # refused while parsing: nothing runs
    err = capsys.readouterr().err
    assert f"{flag}: {message}" in err and err.count("\n") == 1  # argparse names a flag with its aliases (a/b)


def test_a_memory_limit_above_the_host_is_refused_with_its_size(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(memory_probe, "host_memory_bytes", lambda: 16 * GiB)
    assert main(["--device", "cpu", "--memory-limit", "32GB"]) == 2
    err = capsys.readouterr().err
    assert "--memory-limit 32.00 GiB" in err and "this host has (16.00 GiB (17,179,869,184 B))" in err
    assert "at most --memory-limit 16384MiB" in err and err.count("\n") == 1


def test_a_memory_limit_no_host_has_is_refused_for_real(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu", "--memory-limit", "1PiB"]) == 2
    assert "is more than this host has" in capsys.readouterr().err


def test_a_library_user_gets_the_same_memory_limit_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check lives in probe_for_device, which the container calls: it was only in the CLI, so an engine
    built from ServerArgs got a HostMemoryProbe promising 32 GiB of a 16 GiB host."""
    monkeypatch.setattr(memory_probe, "host_memory_bytes", lambda: 16 * GiB)
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "memory_limit": 32 * GiB}),
                             model_config=tiny_model_config())
    with pytest.raises(ConfigError, match=r"^--memory-limit 32.00 GiB .* is more than this host has .*16384MiB$"):
        engine.memory_probe()
    assert memory_probe.probe_for_device(torch.device("cpu"), memory_limit=16 * GiB, card=None).total_bytes() == 16 * GiB


def test_probe_for_device_refuses_a_limit_no_host_has() -> None:
    with pytest.raises(ConfigError, match="is more than this host has"):
        memory_probe.probe_for_device(torch.device("cpu"), memory_limit=1 << 60, card=None)


def test_on_the_cpu_does_not_fit_suggests_a_memory_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu", "--memory-limit", "1GiB", "--json"]) == 3
    suggestions = json.loads(capsys.readouterr().out)["error"]["suggestions"]
    assert any(s.startswith("--memory-limit ") for s in suggestions)
    assert not any("--tp-size" in s for s in suggestions)


def cpu_engine(total_bytes: int, **args: Any) -> EngineContainer:
    """A CPU engine on a simulated host budget (the real host probe measures this process, which moves)."""
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", **args}),
                             model_config=tiny_model_config())
    engine.memory_probe.override(FixedMemoryProbe(total_bytes=total_bytes))
    return engine


@pytest.mark.parametrize("args", [{}, {"kv_cache_memory": 48 * MiB}])
def test_the_suggested_memory_limit_plans(args: dict[str, Any]) -> None:
    # 32 MiB of host: SGLang's reserve for a host that small leaves no KV budget (fraction 0.05), and a
    # 48 MiB --kv-cache-memory is more than is free; the suggested limit fixes either
    with pytest.raises(DoesNotFitError) as info:
        cpu_engine(32 * MiB, **args).engine().bootstrap()
    (suggestion,) = [s for s in info.value.suggestions if s.startswith("--memory-limit")]
    assert not any("--tp-size" in s for s in info.value.suggestions)
    limit = parse_bytes(suggestion.split()[1])
    assert limit % (64 * MiB) == 0
    engine = cpu_engine(limit, **args)
    engine.engine().bootstrap()
    assert engine.engine().target.max_total_num_tokens >= 256  # one request of the tiny model's context
    engine.shutdown_resources()


def test_on_the_cpu_weights_that_do_not_fit_suggest_a_memory_limit(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.worker_refusals.host_memory_bytes", lambda: 64 << 30)  # a host that has the limit
    assert main(["--model", "Llama-3.1-8B-Instruct", "--device", "cpu", "--json"]) == 3
    (suggestion,) = json.loads(capsys.readouterr().out)["error"]["suggestions"]
    # 16,062,087,168 B of bf16 weights and one 131,072-token request of 131,072 B a token (16 GiB), not the weights
    # alone: with those the next answer was "nothing is left for the KV cache"
    assert suggestion.startswith("--memory-limit ") and suggestion.endswith("; the least that holds the weights, the "
                                                                          "runtime's reserve and one full-length request)")
    assert int(suggestion.split()[1].removesuffix("MiB")) * MiB >= 16_062_087_168 + 131_072 * 131_072


def test_a_config_file_may_give_sizes_as_users_type_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "server.toml"
    cfg.write_text('kv-cache-memory = "2GB"\n')
    assert main(["plan", "--gpu", "H200", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_bytes"] == 2 * GiB
    cfg.write_text('kv_cache_memory = "two gigs"\n')
    assert main(["plan", "--gpu", "H200", "--config", str(cfg)]) == 2
    assert "kv_cache_memory in the config file: cannot read 'two gigs' as a size" in capsys.readouterr().err
