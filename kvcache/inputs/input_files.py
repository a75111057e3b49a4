"""Reading a user's input file (a model's config.json, a --config settings file): bounded, UTF-8, one object.

Whatever path a user passes, reading it ends quickly with the file's text or one ConfigError naming the file
and what is wrong: a FIFO, a device (/dev/zero, a terminal) or a directory is refused before a byte is read
(opened non-blocking, then checked with fstat, so nothing can swap the file in between); a regular file is
read to at most MAX_INPUT_FILE_BYTES; the text must be UTF-8 without a byte-order mark (JSON's own rule,
and what transformers and tomllib read); the parsed value must be an object nested at most MAX_NESTING deep.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvcache.errors import ConfigError

MAX_INPUT_FILE_BYTES = 16 << 20  # the largest real config.json (per-module quantization lists) is under 1 MiB
MAX_NESTING = 32  # real configs nest 5 deep (quantization_config.config_groups.group_0.weights.num_bits)
MAX_NUMBER_DIGITS = 4_000  # below Python's 4,300-digit limit: a long number reaches its field, which names it

_BYTE_ORDER_MARKS = ((b"\xef\xbb\xbf", "UTF-8"), (b"\xff\xfe\x00\x00", "UTF-32"),
                     (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def _kind_of(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def read_input_text(path: Path, *, what: str) -> str:
    """The UTF-8 text of the regular file at `path`; `what` names it in messages ('config file', 'model config')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # no permission, a loop of links; ValueError: a NUL byte in the path
        raise ConfigError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        mode, size = (st := os.fstat(fd)).st_mode, st.st_size
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{what} {path} is {_kind_of(mode)}, not a regular file: pass the file itself")
        if size > MAX_INPUT_FILE_BYTES:
            raise ConfigError(f"{what} {path} is {size:,} bytes; expected at most {MAX_INPUT_FILE_BYTES:,} "
                              "(real ones are a few KiB): is it the right file?")
        data = _read_at_most(fd, MAX_INPUT_FILE_BYTES + 1)
    except OSError as exc:  # an I/O error mid-read
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_INPUT_FILE_BYTES:  # it grew after fstat (a file being written)
        raise ConfigError(f"{what} {path} holds more than {MAX_INPUT_FILE_BYTES:,} bytes; is it the right file?")
    return _utf8_text(data, path, what)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _utf8_text(data: bytes, path: Path, what: str) -> str:
    for mark, encoding in _BYTE_ORDER_MARKS:
        if data.startswith(mark):
            raise ConfigError(f"{what} {path} starts with a {encoding} byte-order mark; save it as UTF-8 without one")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ConfigError(f"{what} {path} holds a NUL byte at offset {nul:,}: it is binary or UTF-16/32 text; "
                          "save it as UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start:,}); "
                          "save it as UTF-8") from None


def parse_json_object(text: str, path: Path, *, what: str,
                      pairs: Callable[[Iterable[tuple[str, Any]]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A JSON object (NaN and Infinity read as floats, as real configs hold them; field readers judge values).
    A key given twice with different values is refused (the last one would silently win)."""

    def once(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out and out[key] != value:
                raise ConfigError(f"{what} {path} sets {key!r} twice with different values "
                                  f"({_short(out[key])}, {_short(value)}): keep one")
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs or once, parse_int=_bounded_int)
    except _LongNumber as exc:
        raise ConfigError(f"{what} {path} holds a number of {exc.digits:,} digits; expected at most "
                          f"{MAX_NUMBER_DIGITS}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} nests lists or objects too deep; expected at most {MAX_NESTING} levels") from None
    return _checked_object(data, path, what)


def parse_toml_table(text: str, path: Path, *, what: str) -> dict[str, Any]:
    """A TOML document as a dict."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: an integer of over 4,300 digits
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} nests arrays or tables too deep; expected at most {MAX_NESTING} levels") from None
    return _checked_object(data, path, what)


class _LongNumber(Exception):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_NUMBER_DIGITS:
        raise _LongNumber(digits)
    return int(text)


def _checked_object(data: Any, path: Path, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object (a TOML table), not {type(data).__name__}")
    if _depth(data) > MAX_NESTING:
        raise ConfigError(f"{what} {path} nests lists or objects more than {MAX_NESTING} levels deep; "
                          f"expected at most {MAX_NESTING}")
    return data


def _depth(value: Any) -> int:
    """How deep lists and objects nest (an object of numbers is 1; past MAX_NESTING + 1 it stops counting),
    walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_NESTING:
            stack.extend((child, level + 1) for child in children)
    return deepest


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
