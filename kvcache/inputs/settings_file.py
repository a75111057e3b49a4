"""A --config settings file (TOML or JSON) read into ServerArgs' fields: dashes or underscores, each field's other
spellings as its flag takes them, and a file that is not settings (a model's config.json, a misspelt key) refused
in one line naming what to do."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvcache.errors import ConfigError
from kvcache.inputs.input_files import parse_json_object, parse_toml_table, read_input_text
from kvcache.inputs.other_engines_flags import other_engines_hint
from kvcache.inputs.server_args import ServerArgs


def server_args_from_file(path: str | Path) -> ServerArgs:
    """ServerArgs from a TOML (.toml) or JSON file."""
    return ServerArgs.from_mapping(read_settings_file(path))


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A TOML or JSON file as a dict; dashes in keys become underscores (flag spelling)."""
    if not str(path).strip():  # Path('') is '.', the working directory
        raise ConfigError("--config is empty: give a TOML or JSON settings file")
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        raise ConfigError(f"config file {p} is YAML (SGLang's --config format), which is not read here: write the "
                          "same keys as TOML (page-size = 16) in a .toml file, or as JSON")
    try:
        text = read_input_text(p, what="config file")
    except FileNotFoundError:
        raise ConfigError(f"cannot read config file {p}: No such file or directory") from None

    def once(pairs: Iterable[tuple[Any, Any]]) -> dict[str, Any]:
        """Keys in flag spelling; one set twice with different values (tp-size and tp_size, or a JSON key
        repeated, where the last silently won) is refused."""
        out: dict[str, Any] = {}
        for key, value in pairs:
            name = str(key).replace("-", "_")
            if name in out and out[name] != value:
                raise ConfigError(f"config file {p} sets {name} twice with different values "
                                  f"({out[name]!r}, {value!r}): keep one")
            out[name] = value
        return out

    if p.suffix == ".toml":
        data = parse_toml_table(text, p, what="config file")
    else:
        data = parse_json_object(text, p, what="config file", pairs=once)
    aliases = field_aliases()
    settings = once((aliases.get(k, k), v) for k, v in once(data.items()).items())
    _refuse_unknown_settings(p, settings)
    return settings


def field_aliases() -> dict[str, str]:
    """Each field's other spellings (`server_arg_types.also`: SGLang 0.5.23's, such as tensor_parallel_size or
    cuda_graph_max_bs_decode) as a settings file writes them -> the field, so a file takes what a flag takes."""
    out: dict[str, str] = {}
    for name, hint in typing.get_type_hints(ServerArgs, include_extras=True).items():
        for part in (hint, *typing.get_args(hint)):
            for meta in getattr(part, "__metadata__", ()):
                for flag in (getattr(meta, "extra", None) or {}).get("aliases", ()):
                    out[flag.lstrip("-").replace("-", "_")] = name
    return out


COMMAND_LINE_ONLY = frozenset({"model", "model_path", "gpu", "gpu_memory", "json", "config"})
MODEL_CONFIG_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers")


def _refuse_unknown_settings(path: Path, settings: Mapping[str, Any]) -> None:
    """A settings file holds ServerArgs fields only: a model's config.json passed to --config, or a misspelt
    key, is refused naming what to do instead (msgspec's 'unknown field' names neither the file nor a fix)."""
    known = ServerArgs.__struct_fields__
    unknown = [k for k in settings if k not in known]
    if not unknown:
        return
    model_keys = [k for k in MODEL_CONFIG_KEYS if k in settings]
    if model_keys:
        raise ConfigError(
            f"config file {path} is a model's config.json (it has {model_keys[0]!r}), not server args: "
            f"pass it with --model {path}; --config takes settings such as page_size or kv_cache_dtype"
        )
    hints = [f"{k!r}" + (" (a command-line flag only)" if k in COMMAND_LINE_ONLY else
                         f" ({k} {hint})" if (hint := other_engines_hint(k)) else
                         f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(k, known, n=1)) else "")
             for k in unknown]
    raise ConfigError(f"config file {path}: unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                      "settings are the server-args flags' names (see --help), with - or _")
