"""Reading a HF config.json: typed, bounded fields under their aliases, one error naming field, value and need.

Every number the cache sizing or the weight layout reads comes through `ConfigFields`, so a
missing, zero, negative, fractional, boolean, mistyped or absurd value fails here with one
line, before anything is sized or allocated. `null` counts as absent (real configs write
`"head_dim": null`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, TypeVar

from kvcache.errors import ModelConfigFieldError
from kvcache.inputs.dtypes import TORCH_DTYPE_NAMES

# Bounds no real model comes near; they stop absurd configs before any arithmetic or allocation.
MAX_LAYERS = 10_000
MAX_WIDTH = 1 << 20  # hidden, intermediate, ranks and state sizes
MAX_HEADS = 1 << 14
MAX_HEAD_DIM = 1 << 14
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 31
MAX_EXPERTS = 1 << 14
# A causal conv's state keeps kernel - 1 columns per channel: a kernel of 1 would cache an empty tensor,
# so it is refused here, before anything is sized (no real model has one).
MIN_CONV_KERNEL = 2
MAX_CONV_KERNEL = 64

_MISSING: Any = object()
T = TypeVar("T")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# transformers 5 renames two hybrid layer names on save (its _LEGACY_LAYER_TYPE_REMAP).
TRANSFORMERS5_LAYER_NAMES = {"linear_attention": "mamba", "full_attention": "attention"}


def with_transformers5_names(table: Mapping[str, T]) -> dict[str, T]:
    """A layer-name table that also reads transformers 5's names for the entries it renames."""
    return {**table, **{new: table[old] for new, old in TRANSFORMERS5_LAYER_NAMES.items() if old in table}}


# Which level of a multimodal wrapper speaks for the language model. Every number the language model is sized from
# (layers, heads, widths, vocab, positions, windows, experts) belongs to its own section (text_config...): engines
# build the language model from that section alone (SGLang 0.5.23's get_hf_text_config). A wrapper that repeats one
# of them must repeat it exactly: two values mean the file was edited at one level, or was saved from a form whose
# section the wrapper class does not fill (which then holds the class's defaults), and either way one of the two
# readings sizes the wrong model. The exception is tie_word_embeddings: transformers 5 gives every config class its
# own (72 of its 121 classes with a language-model section write it at both levels, 16 with opposite defaults:
# Mistral3Config True over MistralConfig False, Qwen3VLMoeConfig False over its text class's True), so the levels
# differ in files nobody edited. It says whether the module holding the LM head shares the embedding, so it is read
# from that module's config (ModelSource.head_on_wrapper), and the other level's copy is not compared.
OWN_FIELDS_OF_EVERY_CONFIG_CLASS = frozenset({"tie_word_embeddings"})


@dataclass(frozen=True, slots=True)
class ConfigFields:
    """One (possibly nested) section of a config.json, read field by field for the model `model`."""

    raw: Mapping[str, Any]
    model: str
    path: str = ""
    # the whole file, when this is a multimodal wrapper's language-model section (text_config...): a number
    # stated at the top too must agree with the section's (OWN_FIELDS_OF_EVERY_CONFIG_CLASS says which need not)
    outer: Mapping[str, Any] | None = None

    # ---- lookup ---------------------------------------------------------------------------------
    def has(self, *names: str) -> bool:
        """Whether any of `names` is present and not null."""
        return any(self.raw.get(n) is not None for n in names)

    def _find(self, names: tuple[str, ...]) -> tuple[str, Any] | None:
        for name in names:
            value = self.raw.get(name)
            if value is not None:
                self._agrees_with_outer(name, value)
                return name, value
        return None

    def _agrees_with_outer(self, name: str, value: Any) -> None:
        """A number or switch the wrapper's top level states too must be the same there (model_type and other
        names differ by design between the two, so only numbers are compared; nor are the fields each config class
        declares for itself, OWN_FIELDS_OF_EVERY_CONFIG_CLASS)."""
        if self.outer is None or isinstance(value, str) or name in OWN_FIELDS_OF_EVERY_CONFIG_CLASS:
            return
        top = self.outer.get(name)
        if top is not None and not isinstance(top, str) and top != value:
            self.fail(name, value, f"the value the top level of config.json gives '{name}' ({_shown(top)}): "
                                   "one model cannot have both")

    def repeats(self, name: str, value: Any, source: str, read: Callable[[str], Any] | None = None) -> None:
        """A field that restates what `source` gives (another name, section or form of the same config), where
        present, must give the same `value`, read by `read` (a typed reader of this section; the raw value if
        none): one model cannot state two."""
        if self.has(name) and (stated := (read(name) if read else self.raw[name])) != value:
            self.fail(name, stated, f"{source} ({_shown(value)}), when both are given")

    def fail(self, name: str, value: Any, expected: str) -> NoReturn:
        """Refuse one field: its name (with the section it sits in), its value, what it must be."""
        raise ModelConfigFieldError(
            f"{self.model}: config.json field '{self.path}{name}' is {_shown(value)}; expected {expected}"
        )

    def _missing(self, names: tuple[str, ...], expected: str) -> NoReturn:
        also = f" (nor {', '.join(repr(self.path + n) for n in names[1:])})" if len(names) > 1 else ""
        raise ModelConfigFieldError(
            f"{self.model}: config.json has no '{self.path}{names[0]}'{also}; expected {expected}"
        )

    # ---- typed readers ------------------------------------------------------------------------------
    def int(self, *names: str, default: int = _MISSING, low: int = 1, high: int = MAX_WIDTH) -> int:
        """An integer in [low, high] under the first present alias; `default` when all are absent."""
        found = self._find(names)
        if found is None:
            if default is _MISSING:
                self._missing(names, _int_range(low, high))
            return default
        return self._checked_int(found[0], found[1], low, high)

    def optional_int(self, *names: str, low: int = 1, high: int = MAX_WIDTH) -> int | None:
        """An integer in [low, high], or None when every alias is absent."""
        found = self._find(names)
        return None if found is None else self._checked_int(found[0], found[1], low, high)

    def _checked_int(self, name: str, value: Any, low: int, high: int) -> int:
        if isinstance(value, bool):
            self.fail(name, value, f"{_int_range(low, high)}, not a boolean")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            self.fail(name, value, _int_range(low, high))
        if not low <= value <= high:
            self.fail(name, value, _int_range(low, high))
        return value

    def conv_kernel(self, *names: str) -> int:
        """A causal conv's kernel width (Mamba, gated delta net, KDA): its state keeps kernel - 1 columns."""
        found = self._find(names)
        if found is None:
            self._missing(names, _int_range(MIN_CONV_KERNEL, MAX_CONV_KERNEL))
        name, value = found
        kernel = self._checked_int(name, value, 1, MAX_CONV_KERNEL)
        if kernel < MIN_CONV_KERNEL:
            self.fail(name, value, f"{_int_range(MIN_CONV_KERNEL, MAX_CONV_KERNEL)}: the conv state keeps "
                                   "kernel - 1 columns, so a kernel of 1 leaves nothing to cache")
        return kernel

    def number(self, *names: str, default: float) -> float:
        """A positive, finite real number (norm epsilons, RoPE bases); `default` when all are absent."""
        found = self._find(names)
        if found is None:
            return default
        name, value = found
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            self.fail(name, value, "a positive, finite number")
        return float(value)

    def flag(self, *names: str, default: bool = False) -> bool:
        """A true/false switch (JSON booleans; 0 and 1 are accepted as some configs write them)."""
        found = self._find(names)
        if found is None:
            return default
        name, value = found
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        self.fail(name, value, "true or false")

    def text(self, *names: str, default: str = _MISSING) -> str:
        """A string field."""
        found = self._find(names)
        if found is None:
            if default is _MISSING:
                self._missing(names, "a string")
            return default
        if not isinstance(found[1], str):
            self.fail(found[0], found[1], "a string")
        return found[1]

    def int_list(self, name: str, *, low: int = 0, high: int = MAX_LAYERS) -> tuple[int, ...] | None:
        """A list of integers in [low, high] (layer indices and the like), or None when absent."""
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, (list, tuple)):
            self.fail(name, value, f"a list of {_int_range(low, high)}")
        return tuple(self._checked_int(f"{name}[{i}]", v, low, high) for i, v in enumerate(value))

    def text_list(self, name: str, *, length: int | None = None) -> tuple[str, ...] | None:
        """A list of strings (of `length` items when given), or None when absent."""
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            self.fail(name, value, "a list of strings")
        if length is not None and len(value) != length:
            self.fail(name, f"a list of {len(value)}", f"one entry per layer ({length})")
        return tuple(value)

    def mapped_list(self, *names: str, table: Mapping[str, T], length: int | None = None) -> tuple[T, ...] | None:
        """A per-layer list of names under any of `names` (transformers 5 renamed several, and their entries:
        'mamba' -> 'linear_attention', 'attention' -> 'full_attention'), each entry mapped through `table`;
        None when absent. Two of the lists given must map to the same layers: one model, one answer."""
        found: tuple[str, tuple[T, ...]] | None = None
        for name in names:
            listed = self.text_list(name, length=length)
            if listed is None:
                continue
            unknown = [(i, e) for i, e in enumerate(listed) if e not in table]
            if unknown:
                i, entry = unknown[0]
                self.fail(f"{name}[{i}]", entry, f"one of {', '.join(table)}")
            mapped = tuple(table[e] for e in listed)
            if found is None:
                found = (name, mapped)
            elif mapped != found[1]:
                self.fail(name, list(listed), f"the same layers as '{self.path}{found[0]}' gives, when both are given")
        return None if found is None else found[1]

    def section(self, *names: str) -> ConfigFields | None:
        """A nested object (text_config, vision_config...) as its own fields, or None when absent."""
        found = self._find(names)
        if found is None:
            return None
        if not isinstance(found[1], Mapping):
            self.fail(found[0], found[1], "a JSON object")
        return ConfigFields(found[1], self.model, f"{self.path}{found[0]}.")

    def dtype_name(self) -> str | None:
        """torch_dtype (or the newer `dtype`): None when absent, else the name of a torch dtype."""
        found = self._find(("torch_dtype", "dtype"))
        if found is None:
            return None
        name, value = found
        other = self.raw.get("dtype")
        if name == "torch_dtype" and other is not None and other != value:  # transformers 5 renamed it `dtype`
            self.fail("dtype", other, f"the same as torch_dtype ({_shown(value)}), or only one of the two")
        text = value.removeprefix("torch.") if isinstance(value, str) else None
        if text is None or text not in TORCH_DTYPE_NAMES:
            self.fail(name, value, "the name of a torch dtype such as 'bfloat16', 'float16' or 'float32'")
        return text


def _int_range(low: int, high: int) -> str:
    if low == 1:
        return f"a positive integer (at most {high:,})"
    return f"an integer from {low:,} to {high:,}"
