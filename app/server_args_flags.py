"""The --flags of every ServerArgs field, generated from the Struct so each knob is stated once.

A field `page_size` becomes `--page-size` (SGLang's spelling); its type, bounds, Literal
choices and default come from the annotation, its help from `msgspec.Meta(description=...)`.
Integers marked `extra={"unit": "bytes"}` read sizes ("80GiB"). Flags left out stay
unset (None), so a --config file's value is kept unless a flag overrides it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Callable

from msgspec import inspect as mi

from kvcache.byte_units import parse_bytes
from kvcache.errors import ConfigError
from kvcache.inputs.other_engines_flags import VLLM_FIELDS, special_value_hint
from kvcache.inputs.server_args import ServerArgs


@dataclass(frozen=True, slots=True)
class FieldFlag:
    """One ServerArgs field as a command-line flag."""

    field: str
    kind: mi.Type  # the field's type without Optional and without Metadata
    description: str
    is_bytes: bool
    default: Any
    aliases: tuple[str, ...] = ()  # SGLang's other spellings of the flag

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


def _unwrap(t: mi.Type) -> tuple[mi.Type, str, bool, tuple[str, ...]]:
    """(the type inside Optional/Metadata, its description, whether it counts bytes, its flag's aliases)."""
    if isinstance(t, mi.UnionType):
        inner = [u for u in t.types if not isinstance(u, mi.NoneType)]
        assert len(inner) == 1, f"ServerArgs flags support `X | None` unions only, got {t}"
        t = inner[0]
    description, is_bytes, aliases = "", False, ()
    while isinstance(t, mi.Metadata):
        description = (t.extra_json_schema or {}).get("description", description)
        is_bytes = is_bytes or (t.extra or {}).get("unit") == "bytes"
        aliases = tuple((t.extra or {}).get("aliases", aliases))
        t = t.type
    return t, description, is_bytes, aliases


def server_args_fields() -> tuple[FieldFlag, ...]:
    """Every ServerArgs field, in declaration order."""
    info = mi.type_info(ServerArgs)
    assert isinstance(info, mi.StructType)
    out = []
    for f in info.fields:
        kind, description, is_bytes, aliases = _unwrap(f.type)
        out.append(FieldFlag(field=f.name, kind=kind, description=description, is_bytes=is_bytes,
                             default=None if f.default is mi.NODEFAULT else f.default, aliases=aliases))
    return tuple(out)


def _bounds(kind: mi.IntType | mi.FloatType) -> str:
    parts = [f"{op} {v}" for op, v in ((">=", kind.ge), (">", kind.gt), ("<=", kind.le), ("<", kind.lt)) if v is not None]
    return " and ".join(parts)


def _within(kind: mi.IntType | mi.FloatType, value: float) -> bool:
    return ((kind.ge is None or value >= kind.ge) and (kind.gt is None or value > kind.gt)
            and (kind.le is None or value <= kind.le) and (kind.lt is None or value < kind.lt))


def _number_reader(field: str, kind: mi.IntType | mi.FloatType, *, is_bytes: bool) -> Callable[[str], Any]:
    """An argparse `type` that reads the number and checks the field's bounds."""
    noun = "a size" if is_bytes else ("an integer" if isinstance(kind, mi.IntType) else "a number")

    def read(text: str) -> int | float:
        try:
            value: int | float = (parse_bytes(text) if is_bytes else
                                  int(text) if isinstance(kind, mi.IntType) else float(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) if is_bytes else f"expected {noun}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if not _within(kind, value):
            special = special_value_hint(field, text)
            raise argparse.ArgumentTypeError(f"expected {noun} {_bounds(kind)}, got {text!r}"
                                             + (f": {text} {special}" if special else ""))
        return value

    return read


def _counts_reader(field: str, kind: mi.IntType) -> Callable[[str], tuple[int, ...]]:
    """An argparse `type` for a comma-separated list of integers ("7,7,7,8"), each within the item's bounds."""
    read_one = _number_reader(field, kind, is_bytes=False)

    def read(text: str) -> tuple[int, ...]:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 16,16, got {text!r}")
        values = []
        for entry, part in enumerate(parts):
            try:
                values.append(read_one(part))
            except argparse.ArgumentTypeError as exc:  # which entry, and a list that reads
                raise argparse.ArgumentTypeError(f"entry {entry} of {text!r}: {exc}; e.g. 16,16 (32 layers over "
                                                 "--pp-size 2)") from None
        return tuple(values)

    return read


def _help(f: FieldFlag) -> str:
    text = f.description or f.field.replace("_", " ")
    if isinstance(f.kind, mi.LiteralType):
        text += f"; one of {', '.join(map(str, f.kind.values))}"
    if f.default not in (None, False):
        text += f" (default {f.default})"
    return text


def add_server_args_flags(parser: argparse.ArgumentParser, *, leave_out: frozenset[str] = frozenset()) -> None:
    """One flag per ServerArgs field, in a group of its own; not the fields in `leave_out`, which mean
    nothing to this command (`plan` has no host --memory-limit and no --device)."""
    group = parser.add_argument_group("server args (ServerArgs fields, named as SGLang names them)")
    for f in server_args_fields():
        if f.field in leave_out:
            continue
        kwargs: dict[str, Any] = {"dest": f.field, "default": None, "help": _help(f)}
        if isinstance(f.kind, mi.BoolType):
            # on by default, or vLLM's (whose every switch is --x / --no-x): both spellings
            negatable = f.default is True or f.field in VLLM_FIELDS
            kwargs["action"] = argparse.BooleanOptionalAction if negatable else "store_true"
        elif isinstance(f.kind, mi.LiteralType):
            kwargs.update(choices=f.kind.values, metavar=f.field.upper().split("_")[-1])
        elif isinstance(f.kind, (mi.IntType, mi.FloatType)):
            kwargs.update(type=_number_reader(f.field, f.kind, is_bytes=f.is_bytes),
                          metavar="SIZE" if f.is_bytes else "N" if isinstance(f.kind, mi.IntType) else "X")
        elif isinstance(f.kind, mi.VarTupleType) and isinstance(f.kind.item_type, mi.IntType):
            kwargs.update(type=_counts_reader(f.field, f.kind.item_type), metavar="N,N,...")
        elif isinstance(f.kind, mi.StrType):
            kwargs.update(type=str, metavar="TEXT")
        else:
            raise TypeError(f"no flag for ServerArgs.{f.field} of type {f.kind}")
        group.add_argument(f.flag, *f.aliases, **kwargs)


def server_args_values(ns: argparse.Namespace) -> dict[str, Any]:
    """The ServerArgs fields the command line set (flags not given are left out)."""
    return {f.field: getattr(ns, f.field) for f in server_args_fields() if getattr(ns, f.field, None) is not None}



def sizes_read(data: dict[str, Any]) -> dict[str, Any]:
    """A settings mapping with size strings ("20GiB") in byte fields read as bytes, as the flags read them."""
    out = dict(data)
    for f in server_args_fields():
        value = out.get(f.field)
        if f.is_bytes and isinstance(value, str):
            try:
                out[f.field] = parse_bytes(value)
            except ValueError as exc:
                raise ConfigError(f"{f.field} in the config file: {exc}") from None
    return out
