"""A --config settings file's values checked as ServerArgs, with a refusal in the file's and the flag's words."""

from __future__ import annotations

import re
from typing import Any, Mapping

from kvcache.errors import ConfigError
from kvcache.inputs.server_args import ServerArgs

# msgspec's "- at `$.pp_layer_partition[0]`": the field, and the entry of a list refused (none for a plain value)
AT_FIELD = r" - at `\$\.(\w+)((?:\[\d+\])*)`"
# a value that works, where one does not depend on the model: said after the refusal
EXAMPLES = {"pp_layer_partition": "give one layer count of at least 1 a stage, summing to the model's layers, "
                                  "e.g. pp-layer-partition = [16, 16] (32 layers over --pp-size 2)"}


def checked_server_args(data: Mapping[str, Any], *, from_file: Mapping[str, Any], flags: Mapping[str, Any],
                        path: str | None) -> ServerArgs:
    """ServerArgs from `data` (the file's values overlaid with the flags'); a value refused that came from the
    file, and no flag replaced, is refused naming the file, the key and its flag."""
    try:
        return ServerArgs.from_mapping(data)
    except ConfigError as exc:
        field = re.search(AT_FIELD, str(exc))
        if path is None or field is None or field.group(1) not in from_file or field.group(1) in flags:
            raise
        raise ConfigError(settings_file_refusal(path, field.group(1), from_file[field.group(1)], str(exc))) from None


def settings_file_refusal(path: str, field: str, value: Any, message: str) -> str:
    """A settings file's bad value in the flag's words: 'config file s.toml: mem-fraction-static = 1.5 is refused
    (--mem-fraction-static, ServerArgs.mem_fraction_static): expected a float < 1.0', not msgspec's
    "Expected `float` < 1.0 - at `$.mem_fraction_static`"."""
    why = message.removeprefix("invalid server args: ")
    entry = re.search(AT_FIELD, why)
    why = re.sub(AT_FIELD, "", why) + (f" at entry {entry.group(2)[1:-1]}" if entry and entry.group(2) else "")
    why = re.sub(r"Expected `([^`]+)`", lambda m: f"expected {m.group(1).replace(' | null', '')}", why)
    why = re.sub(r"got `([^`]+)`", r"got \1", why)
    flag = field.replace("_", "-")
    example = f"; {EXAMPLES[field]}" if field in EXAMPLES else ""
    return f"config file {path}: {flag} = {value!r} is refused (--{flag}, ServerArgs.{field}): {why}{example}"
