"""A --config settings file's values checked as ServerArgs, with a refusal in the file's and the flag's words."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from kvcache.errors import ConfigError
from kvcache.inputs.pipeline_stages import even_stage_layer_counts
from kvcache.inputs.server_args import ServerArgs

# msgspec's "- at `$.pp_layer_partition[0]`": the field, and the entry of a list refused (none for a plain value)
AT_FIELD = r" - at `\$\.(\w+)((?:\[\d+\])*)`"
PARTITION_RULE = "give one layer count of at least 1 a stage, summing to the model's layers, e.g. "


def partition_example(data: Mapping[str, Any], model_layers: Callable[[], int] | None) -> str:
    """A --pp-layer-partition that plans: SGLang's own split of the model's layers over the --pp-size given (16,16
    for 32 layers over 2 stages where the model or the size cannot be read)."""
    pp_size = data.get("pp_size", 1)
    try:
        layers = model_layers() if model_layers is not None and isinstance(pp_size, int) else None
        counts = list(even_stage_layer_counts(layers, pp_size)) if layers is not None else None
    except (ConfigError, OSError, ValueError):
        counts = None
    if counts is None:
        return PARTITION_RULE + "pp-layer-partition = [16, 16] (32 layers over --pp-size 2)"
    return PARTITION_RULE + f"pp-layer-partition = {counts} (SGLang's own split of {layers} layers over --pp-size {pp_size})"


def checked_server_args(data: Mapping[str, Any], *, from_file: Mapping[str, Any], flags: Mapping[str, Any],
                        path: str | None, model_layers: Callable[[], int] | None = None) -> ServerArgs:
    """ServerArgs from `data` (the file's values overlaid with the flags'); a value refused that came from the
    file, and no flag replaced, is refused naming the file, the key and its flag (and, for a layer split, a split
    of the model's layers: `model_layers` reads them, only then)."""
    try:
        return ServerArgs.from_mapping(data)
    except ConfigError as exc:
        field = re.search(AT_FIELD, str(exc))
        if path is None or field is None or field.group(1) not in from_file or field.group(1) in flags:
            raise
        name = field.group(1)
        example = partition_example(data, model_layers) if name == "pp_layer_partition" else ""
        raise ConfigError(settings_file_refusal(path, name, from_file[name], str(exc))
                          + (f"; {example}" if example else "")) from None


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
    return f"config file {path}: {flag} = {value!r} is refused (--{flag}, ServerArgs.{field}): {why}"
