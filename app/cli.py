"""The command line: `bootstrap` (the default), `plan` (a dry run for a card you do not have), `fit` (which
cards, TP sizes and KV dtypes serve a target: app/fit_command.py), `presets`.

Flags carry SGLang's names and are generated from ServerArgs (app/server_args_flags.py).
Exit codes: 0 success, 2 bad input, 3 does not fit, 1 a bug (see app/failures.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping, NoReturn, Sequence


from app.failures import OutputUnwritableError, UsageError, failure_of
from app.fit_command import SWEPT_FIELDS, add_fit_flags, run_fit
from app.plan_command import plan_output
from app.flag_hints import BOOTSTRAP_ONLY_FIELDS, COMMANDS, unknown_command, unrecognized, value_read_as_flag
from app.server_args_flags import add_server_args_flags, server_args_values, sizes_read
from app.settings_file import checked_server_args
from kvcache.byte_units import SIZE_UNITS_HELP
from kvcache.engines.vllm import VLLM
from kvcache.inputs.cards import KNOWN_CARDS, SimulatedCard, card_named, card_of_size
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import DEFAULT_PRESET, load_model_config, preset_names
from kvcache.inputs.other_engines_flags import VLLM_FIELDS
from kvcache.inputs.server_args import ServerArgs
from kvcache.inputs.settings_file import read_settings_file

EXIT_OK = 0
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose pipe closed
FIRST_WORDS = frozenset({*COMMANDS, "-h", "--help"})  # a first argument that is not a model or a flag
VLLM_ONLY = frozenset(VLLM_FIELDS)  # vLLM's knobs: only `plan --engine vllm` has a use for them


def _add_common(p: argparse.ArgumentParser, *, leave_out: frozenset[str] = frozenset()) -> None:
    p.add_argument("--model", "--model-path", default=DEFAULT_PRESET,
                   help=f"a preset name, a model directory or a config.json (default {DEFAULT_PRESET})")
    p.add_argument("--config", help="ServerArgs from a TOML or JSON file; flags override it")
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    add_server_args_flags(p, leave_out=leave_out)


class _GivenValues(argparse.Namespace):
    """A Namespace that remembers every value set on each name: the default first, then each flag given."""

    __slots__ = ("given",)

    def __init__(self) -> None:
        object.__setattr__(self, "given", {})
        super().__init__()

    def __setattr__(self, name: str, value: Any) -> None:
        self.given.setdefault(name, []).append(value)
        super().__setattr__(name, value)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: main() reports it in one line. A flag given
    twice with different values (--tp-size 2 ... --tensor-parallel-size 4, pasted beside ours) is refused: argparse
    keeps the last one, and the report does not show every value it sized with."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns = _GivenValues() if namespace is None else namespace
        parsed, extras = super().parse_known_args(args, ns)
        for dest, values in getattr(ns, "given", {}).items():
            distinct = list(dict.fromkeys(repr(v) for v in values[1:]))  # values[0] is the default
            if len(distinct) > 1:
                flags = next(("/".join(a.option_strings) for a in self._actions if a.dest == dest), dest)
                self.error(f"{flags} is given twice with different values ({', '.join(distinct)}): keep one")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvcache", description="How much KV cache fits, and the pools that hold it.")
    sub = parser.add_subparsers(dest="command")
    _add_common(sub.add_parser("bootstrap", help="load dummy weights on this machine, size and build the KV cache (default)",
                               epilog=SIZE_UNITS_HELP + "."), leave_out=VLLM_ONLY)
    plan = sub.add_parser("plan", help="a dry run for a card you do not have (meta device, allocates nothing)",
                          epilog=SIZE_UNITS_HELP + ".")
    _add_common(plan, leave_out=BOOTSTRAP_ONLY_FIELDS)
    card = plan.add_mutually_exclusive_group(required=True)
    card.add_argument("--gpu-memory", metavar="SIZE", help="the card's capacity, e.g. 80GB (= 80GiB)")
    card.add_argument("--gpu", help=f"a named card: {', '.join(KNOWN_CARDS)}")
    fit = sub.add_parser("fit", help="which card, TP size and KV dtype serve N requests of C tokens (a plan per cell)",
                         epilog=SIZE_UNITS_HELP + ".")
    _add_common(fit, leave_out=BOOTSTRAP_ONLY_FIELDS | SWEPT_FIELDS)
    add_fit_flags(fit)
    sub.add_parser("presets", help="list the shipped model configs")
    return parser


def parse_command_line(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """The parsed command line; anything argparse cannot place is refused with a hint for each flag."""
    try:
        ns, extras = parser.parse_known_args(args)
    except UsageError as exc:
        hint = value_read_as_flag(str(exc), args)
        if hint is None:
            raise
        raise UsageError(str(exc).replace(" (see ", f"; {hint} (see ", 1)) from None
    if extras:
        command = ns.command or "bootstrap"
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        raise UsageError(f"{unrecognized(extras, command, list(sub._option_string_actions))} (see {sub.prog} --help)")
    return ns


def server_args_from(ns: argparse.Namespace, *, device: str | None = None) -> ServerArgs:
    """ServerArgs from --config (if any) overlaid with the flags that were given."""
    from_file: dict[str, Any] = sizes_read(read_settings_file(ns.config)) if ns.config is not None else {}
    flags = server_args_values(ns)
    data = {**from_file, **flags}
    if device is not None:
        data["device"] = device
    return checked_server_args(data, from_file=from_file, flags=flags, path=ns.config,
                               model_layers=lambda: load_model_config(ns.model).num_hidden_layers)


def _card(ns: argparse.Namespace) -> SimulatedCard:
    return card_named(ns.gpu) if ns.gpu is not None else card_of_size(ns.gpu_memory)


def run(ns: argparse.Namespace) -> int:
    command = ns.command or "bootstrap"
    if command == "presets":
        for name in preset_names():
            m = load_model_config(name)
            layers = m.num_hidden_layers
            print(f"{name:<30} {m.architecture:<26} {layers:>3} layer{'s' if layers != 1 else ' '}  "
                  f"ctx {m.max_position_embeddings:>7,}")
        return EXIT_OK
    if command == "bootstrap" and ns.device == "meta":
        raise UsageError("--device meta is a dry run: use plan --gpu NAME or plan --gpu-memory SIZE "
                         "(bootstrap runs on this machine)")
    if command == "fit":
        from_file: dict[str, Any] = sizes_read(read_settings_file(ns.config)) if ns.config is not None else {}
        flags = server_args_values(ns)
        return run_fit(ns, load_model_config(ns.model), from_file=from_file, flags=flags)
    return _run_engine(ns, command)


def _run_engine(ns: argparse.Namespace, command: str) -> int:
    """`plan` (a dry run: app.plan_command, no torch), or `bootstrap`: the only command that imports the engine,
    and with it torch (presets, fit, plan and --help answer without it). plan's card is read first, without the
    model: a mistyped --gpu is named before the model, a settings file or a draft is read."""
    card = _card(ns) if command == "plan" else None
    server_args = server_args_from(ns, device="meta" if command == "plan" else None)
    if server_args.engine == VLLM.name and command != "plan":
        raise UsageError("--engine vllm is a dry run of vLLM's block plan: use plan --engine vllm --gpu NAME "
                         f"({command} builds this engine's pools)")
    model = load_model_config(ns.model)
    if card is not None:
        output = plan_output(server_args, model, card, as_json=ns.json)
    else:
        output = _bootstrap(server_args, model, as_json=ns.json)
    if output is not None:
        _write_report(output)
    return EXIT_OK


def _bootstrap(server_args: ServerArgs, model: ModelConfig, *, as_json: bool) -> str | None:
    """Start the engine on this machine's device (dummy weights, the pools built) and report it."""
    from app.rank_report import render_for_this_rank
    from app.report import build_report
    from containers import EngineContainer

    container = EngineContainer(server_args=server_args, model_config=model, card=None)
    try:
        rules = container.engine_rules()  # an --engine not available yet stops here, before any weights load
        container.draft_model_config()
        engine = container.engine()
        engine.bootstrap()
        report = build_report(engine, rules=rules, page_size_note=container.page_size_note())
        return render_for_this_rank(engine, report, as_json=as_json)  # rank 0 gathers every rank's plan
    finally:
        container.shutdown_resources()


def _write_report(text: str) -> None:
    """The report on stdout, flushed here so that a full disk or a lost device is this command's one-line
    failure (exit 2), not an 'internal error' nor a message at interpreter exit. A closed pipe stays 141."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more can reach the old stdout; stop a retry at exit
        raise OutputUnwritableError(f"cannot write the report to stdout: {exc.strerror or exc} (errno {exc.errno}); "
                                    "free space there or redirect it elsewhere") from None


def _with_command(args: list[str]) -> list[str]:
    """`bootstrap` when no command is named; a first word that is no command (`plna`) is refused, not taken
    for bootstrap's stray argument."""
    if args and not args[0].startswith("-") and args[0] not in COMMANDS:
        raise UsageError(unknown_command(args[0]))
    return args if args and args[0] in FIRST_WORDS else ["bootstrap", *args]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure is one line on stderr (and a JSON error object with --json)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(parse_command_line(build_parser(), _with_command(args)))
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else EXIT_OK
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to report to
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python's documented way to stop a second EPIPE at exit
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("kvcache: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes one line
        failure = failure_of(exc)
        if failure.kind in ("bad_input", "does_not_fit") and not _speaks_for_the_ranks(os.environ):
            return failure.exit_code  # rank 0 says it: every rank read the same input, or agreed on the error
        if any(len(arg) > 2 and "--json".startswith(arg) for arg in args):  # --json, or argparse's --js
            print(failure.json())
        print(failure.line(), file=sys.stderr)
        return failure.exit_code


def _speaks_for_the_ranks(environ: Mapping[str, str]) -> bool:
    """Whether this process reports a failure every rank shares: alone, or rank 0 of the ranks torchrun started
    (RANK in its environment). Bad input is the same on every rank, and the ranks agree on a failing step
    (kvcache.inputs.rank_agreement), so one line says it; a bug is reported by the rank that hit it, and a lost
    rank by every survivor (rank 0 may be the one lost)."""
    return environ.get("RANK", "0").strip() in ("0", "")
