"""The command line: `bootstrap` (the default), `plan` (a dry run for a card you do not have), `presets`.

Flags carry SGLang's names. Exit codes: 0 success, 2 bad input, 3 does not fit.
"""

from __future__ import annotations

import argparse
import sys
import warnings

# torch warns at import when NumPy is absent; this engine never hands tensors to NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
from typing import Any, Callable, NoReturn, Sequence

import msgspec

from containers import EngineContainer
from kvcache.byte_units import parse_bytes
from kvcache.cards import KNOWN_CARDS, SimulatedCard, card_named, card_of_size
from app.failures import UsageError, failure_of
from kvcache.presets import DEFAULT_PRESET, load_model_config, preset_names
from kvcache.server_args import ServerArgs, read_settings_file

EXIT_OK = 0
COMMANDS = frozenset({"bootstrap", "plan", "presets", "-h", "--help"})


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# (flag, type or "flag" for a switch, help). The ServerArgs field is the flag without dashes.
SERVER_ARG_FLAGS: tuple[tuple[str, Callable[[str], Any] | str, str], ...] = (
    ("--mem-fraction-static", float, "fraction of the card for weights + KV (0..1); derived from the card when not given"),
    ("--kv-cache-memory", _size, "absolute KV budget, e.g. 20GiB (checked against what is free)"),
    ("--memory-limit", _size, "host budget for a CPU engine, e.g. 8GiB (default 8GiB)"),
    ("--max-total-tokens", int, "cap on KV tokens"),
    ("--max-running-requests", int, "cap on concurrent requests"),
    ("--context-length", int, "context length (at most the model's)"),
    ("--allow-long-context", "flag", "allow --context-length above the model's max_position_embeddings"),
    ("--page-size", int, "tokens per KV page"),
    ("--dtype", str, "model dtype: auto, bfloat16, float16, float32"),
    ("--kv-cache-dtype", str, "KV dtype: auto, bfloat16, float16, float32, fp8_e4m3, fp8_e5m2, fp4_e2m1"),
    ("--chunked-prefill-size", int, "prefill chunk (sets the runtime reserve)"),
    ("--cuda-graph-max-bs", int, "largest CUDA-graph batch (sets the runtime reserve)"),
    ("--device", str, "auto, cuda, cpu (plan always uses meta)"),
    ("--tp-size", int, "tensor-parallel size"),
    ("--pp-size", int, "pipeline-parallel size"),
    ("--dp-size", int, "data-parallel size (attention DP with --enable-dp-attention)"),
    ("--enable-dp-attention", "flag", "data-parallel attention"),
    ("--disable-radix-cache", "flag", "no prefix cache (hybrids then keep 1 state slot per request)"),
    ("--swa-full-tokens-ratio", float, "sliding-window pool size as a fraction of the full pool"),
    ("--mamba-full-memory-ratio", float, "state : KV share of the budget for Mamba/linear hybrids"),
    ("--mamba-ssm-dtype", str, "SSM state dtype: float32, bfloat16, float16"),
    ("--max-mamba-cache-size", int, "state slots to keep (overrides the ratio)"),
    ("--speculative-algorithm", str, "none, EAGLE, EAGLE3, STANDALONE, NEXTN"),
    ("--speculative-draft-model", str, "draft model: a preset or a path"),
    ("--speculative-num-steps", int, "draft steps per verify"),
    ("--speculative-eagle-topk", int, "draft branches per step"),
    ("--speculative-num-draft-tokens", int, "tokens verified per step"),
)


def _field(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_PRESET, help=f"a preset name, a model directory or a config.json (default {DEFAULT_PRESET})")
    p.add_argument("--config", help="ServerArgs from a TOML or JSON file; flags override it")
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    for flag, kind, text in SERVER_ARG_FLAGS:
        if kind == "flag":
            p.add_argument(flag, action="store_true", default=None, help=text)
        else:
            p.add_argument(flag, type=kind, default=None, help=text)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: main() reports it in one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvcache", description="How much KV cache fits, and the pools that hold it.")
    sub = parser.add_subparsers(dest="command")
    _add_common(sub.add_parser("bootstrap", help="load dummy weights on this machine, size and build the KV cache (default)"))
    plan = sub.add_parser("plan", help="a dry run for a card you do not have (meta device, allocates nothing)")
    _add_common(plan)
    card = plan.add_mutually_exclusive_group(required=True)
    card.add_argument("--gpu-memory", help="the card's capacity, e.g. 80GiB")
    card.add_argument("--gpu", help=f"a named card: {', '.join(KNOWN_CARDS)}")
    sub.add_parser("presets", help="list the shipped model configs")
    return parser


def server_args_from(ns: argparse.Namespace, *, device: str | None = None) -> ServerArgs:
    """ServerArgs from --config (if any) overlaid with the flags that were given."""
    data: dict[str, Any] = read_settings_file(ns.config) if ns.config else {}
    for flag, _kind, _text in SERVER_ARG_FLAGS:
        value = getattr(ns, _field(flag))
        if value is not None:
            data[_field(flag)] = value
    if device is not None:
        data["device"] = device
    return ServerArgs.from_mapping(data)


def _card(ns: argparse.Namespace) -> SimulatedCard:
    return card_named(ns.gpu) if ns.gpu else card_of_size(ns.gpu_memory)


def run(ns: argparse.Namespace) -> int:
    from app.report import build_report, render_text

    command = ns.command or "bootstrap"
    if command == "presets":
        for name in preset_names():
            m = load_model_config(name)
            print(f"{name:<30} {m.architecture:<26} {m.num_hidden_layers:>3} layers  ctx {m.max_position_embeddings}")
        return EXIT_OK
    card = _card(ns) if command == "plan" else None
    server_args = server_args_from(ns, device="meta" if command == "plan" else None)
    model = load_model_config(ns.model)
    container = EngineContainer(server_args=server_args, model_config=model, card=card)
    try:
        container.draft_model_config()
        engine = container.engine()
        engine.bootstrap()
        report = build_report(engine, card=card.name if card else None)
    finally:
        container.shutdown_resources()
    print(msgspec.json.encode(report).decode() if ns.json else render_text(report))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure is one line on stderr (and a JSON error object with --json)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:  # no subcommand: bootstrap
        args.insert(0, "bootstrap")
    try:
        return run(build_parser().parse_args(args))
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print("kvcache: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes one line
        failure = failure_of(exc)
        if "--json" in args:
            print(failure.json())
        print(failure.line(), file=sys.stderr)
        return failure.exit_code
