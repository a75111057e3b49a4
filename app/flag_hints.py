"""What to say about a command line argparse could not place: the flag meant, not just "unrecognized".

An operator pastes flags from a vLLM launch, from the other subcommand (`--gpu` belongs to `plan`), or
mistypes one. Each unplaced flag gets one hint: this tool's name for vLLM's flag, the subcommand that has
it, or the closest flag here; the whole stays one line.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Iterable, Sequence

from kvcache.inputs.other_engines_flags import other_engines_hint
from kvcache.models.presets import preset_names

_UNIT = re.compile(r"[kmgtp]?i?b|[kmgtp]", re.IGNORECASE)  # a unit typed apart from its number

PLAN_ONLY_FLAGS = ("--gpu", "--gpu-memory")
BOOTSTRAP_ONLY_FIELDS = frozenset({"memory_limit", "device"})  # plan sizes a named card on the meta device
BOOTSTRAP_ONLY_FLAGS = tuple(sorted("--" + field.replace("_", "-") for field in BOOTSTRAP_ONLY_FIELDS))

COMMANDS = ("bootstrap", "plan", "fit", "presets")


def _looks_like_a_model(word: str) -> bool:
    """A preset's name (any case), a path, or a Hugging Face repo id: what `vllm serve MODEL` takes bare."""
    try:
        exists = Path(word).exists()
    except (OSError, ValueError):  # too long for a path, or a NUL byte: no file
        exists = False
    return bool(word) and (word.lower() in {n.lower() for n in preset_names()} or "/" in word or exists)


def unknown_command(word: str) -> str:
    """The line for a first word that is neither a command nor a flag (a typo of `plan`, a bare model name)."""
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    fix = (f"did you mean `{close[0]}`?" if close else "for help, --help" if word.lower() == "help" else
           f"a model is passed with --model {word}" if _looks_like_a_model(word) else "a model goes in --model NAME")
    return f"unknown command {word!r}: the commands are bootstrap (the default), plan, fit and presets; {fix}"


def _hint(flag: str, command: str, known: Sequence[str]) -> str:
    if flag in PLAN_ONLY_FLAGS and command != "plan":
        return f"{flag} belongs to `plan`, the dry run for a card (python -m app plan {flag} ...)"
    if flag in BOOTSTRAP_ONLY_FLAGS and command == "plan":
        return f"{flag} is for bootstrap (this machine); plan sizes the card --gpu or --gpu-memory names: drop {flag}"
    if (hint := other_engines_hint(flag)) is not None:
        return f"{flag} {hint}"
    close = difflib.get_close_matches(flag, [k for k in known if k not in ("-h", "--help")], n=1, cutoff=0.75)
    return f"{flag}: did you mean {close[0]}?" if close else f"{flag} is not a flag of `{command}`"


def unrecognized(extras: Iterable[str], command: str, known: Sequence[str]) -> str:
    """One line for the arguments argparse left over: each flag's hint, and any stray values."""
    extras = list(extras)
    flags = [e.split("=", 1)[0] for e in extras if e.startswith("-")]
    values = [e for e in extras if not e.startswith("-")]
    parts = [_hint(f, command, known) for f in flags]
    if values and not flags:
        units = [v for v in values if _UNIT.fullmatch(v)]
        models = [v for v in values if _looks_like_a_model(v)]
        parts.append(f"{' '.join(v or repr(v) for v in values)} follows no flag" + (" (a size is one word: 80GiB, not 80 GiB)" if units else
                                                               f" (a model is passed with --model {models[0]})" if models else ""))
    return f"unrecognized arguments: {' '.join(extras)}; " + "; ".join(parts)


_NO_VALUE = re.compile(r"argument (\S+): expected one argument")


def value_read_as_flag(message: str, args: Sequence[str]) -> str | None:
    """For argparse's "argument --x: expected one argument" where a value was given but starts with '-'
    ('--kv-cache-memory -1GB'): say that it was read as a flag, as no value here is negative."""
    match = _NO_VALUE.search(message)
    if match is None:
        return None
    names = match.group(1).split("/")
    for i, arg in enumerate(args[:-1]):
        if arg in names and args[i + 1].startswith("-") and not args[i + 1].startswith("--"):
            return f"{args[i + 1]!r} after {arg} is read as a flag; no value here is negative"
    return None
