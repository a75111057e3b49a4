"""How a checkpoint stores its quantized linear weights: read once from quantization_config, consumed by the loader.

Each modelled format is a frozen type that lists the tensors one quantized weight takes
(`stored`); weights the format does not cover (norms, embeddings, exempt modules) keep the
model dtype:

- ``fp8`` (DeepSeek-V3 style): the weight as uint8, one byte per element, plus a float32
  ``<name>_scale_inv`` of ceil(rows / block) x ceil(cols / block) per matrix for block
  quantization (weight_block_size), or one float32 per matrix without blocks (per-tensor).
- ``mxfp4`` (gpt-oss experts): uint8 of ceil(cols / 2) per row, two 4-bit values a byte, plus
  uint8 ``<name>_scales`` of ceil(cols / 32) per row (one E8M0 exponent per 32 inputs).
- ``compressed-tensors`` with ``pack-quantized`` int weights (Kimi-K2.5: 4 bits, groups of 32,
  symmetric), as SGLang 0.5.23's WNA16 scheme holds them: ``<name>_packed`` int32 of
  ceil(cols x bits / 32) per row, ``<name>_scale`` in the model dtype of ceil(cols / group_size)
  per row (one per row for the channel strategy) and, for asymmetric schemes,
  ``<name>_zero_point`` int32 of ceil(rows x bits / 32) x groups. The 2-element shape record
  per matrix (under 1 MiB for Kimi-K2.5) is not counted.

Any other quantization_config (another quant_method, or a compressed-tensors scheme outside
the above) is refused with one line rather than counted at the model dtype, and so is a model
directory whose hf_quant_config.json (ModelOpt) names a weight format config.json does not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from kvcache.errors import ConfigError
from kvcache.inputs.dtypes import FLOAT32, INT32, UINT8, DType
from kvcache.inputs.input_files import parse_json_object, read_input_text
from kvcache.models.fields import ConfigFields
from kvcache.models.weight_blocks import ParamSpec
from kvcache.arithmetic import ceil_div

MXFP4_GROUP = 32


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor that holds (part of) a parameter: the weight itself or its scales."""

    name: str
    shape: tuple[int, ...]
    dtype: DType

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Fp8Weights:
    """fp8 weights with float32 inverse scales per [rows, cols] block, or per matrix when `block` is None."""

    block: tuple[int, int] | None = (128, 128)

    def stored(self, spec: ParamSpec, dtype: DType) -> tuple[StoredTensor, ...]:
        *lead, rows, cols = spec.shape
        scales = tuple(lead) if self.block is None else (*lead, ceil_div(rows, self.block[0]), ceil_div(cols, self.block[1]))
        return (StoredTensor(spec.name, spec.shape, UINT8),
                StoredTensor(f"{spec.name}_scale_inv", scales, FLOAT32))


@dataclass(frozen=True, slots=True)
class Mxfp4Weights:
    """MXFP4: two e2m1 values a byte, one uint8 exponent per 32 inputs."""

    def stored(self, spec: ParamSpec, dtype: DType) -> tuple[StoredTensor, ...]:
        *lead, rows, cols = spec.shape
        return (StoredTensor(spec.name, (*lead, rows, ceil_div(cols, 2)), UINT8),
                StoredTensor(f"{spec.name}_scales", (*lead, rows, ceil_div(cols, MXFP4_GROUP)), UINT8))


@dataclass(frozen=True, slots=True)
class PackedIntWeights:
    """compressed-tensors pack-quantized ints: `bits`-bit values packed in int32 along the input dimension,
    a scale per `group_size` inputs (per row when None) and packed zero points unless symmetric."""

    bits: int
    group_size: int | None
    symmetric: bool = True

    def stored(self, spec: ParamSpec, dtype: DType) -> tuple[StoredTensor, ...]:
        *lead, rows, cols = spec.shape
        groups = 1 if self.group_size is None else ceil_div(cols, self.group_size)
        out = (StoredTensor(f"{spec.name}_packed", (*lead, rows, ceil_div(cols * self.bits, 32)), INT32),
               StoredTensor(f"{spec.name}_scale", (*lead, rows, groups), dtype))
        if self.symmetric:
            return out
        return out + (StoredTensor(f"{spec.name}_zero_point", (*lead, ceil_div(rows * self.bits, 32), groups), INT32),)


WeightFormat = Fp8Weights | Mxfp4Weights | PackedIntWeights
MODELLED_METHODS = ("fp8", "mxfp4", "compressed-tensors")


@dataclass(frozen=True, slots=True)
class Quantization:
    """The checkpoint's weight format (None: the model dtype) and the module patterns it leaves unquantized."""

    method: str | None = None
    weights: WeightFormat | None = None
    exempt: tuple[str, ...] = ()

    def covers(self, name: str) -> bool:
        """A module pattern (glob, or 're:' regex as compressed-tensors writes) exempts a tensor of that module."""
        if self.weights is None:
            return False
        if self.method == "mxfp4" and ".experts." not in name:  # both engines' Mxfp4Config.get_quant_method (quantization/
            return False  # mxfp4.py) quantize fused MoE experts only; Linear and attention layers stay unquantized
        for pattern in self.exempt:
            if pattern.startswith("re:"):  # the reader checked that it compiles
                if re.match(pattern[3:], name):
                    return False
            elif fnmatchcase(name, pattern) or fnmatchcase(name, f"{pattern}.*"):
                return False
        return True

    def stored(self, spec: ParamSpec, dtype: DType) -> tuple[StoredTensor, ...]:
        """The tensors that hold one parameter: the format's for a quantized weight, else one in `dtype`."""
        if not spec.quantized or self.weights is None:
            return (StoredTensor(spec.name, spec.shape, dtype),)
        return self.weights.stored(spec, dtype)


def read_quantization(f: ConfigFields) -> Quantization:
    """quantization_config: the weight format it names and the modules it leaves unquantized."""
    q = f.section("quantization_config")
    if q is None or not q.raw:
        return Quantization()
    method = q.text("quant_method", default="unknown")
    block = q.int_list("weight_block_size", low=1, high=1 << 16)
    if block is not None and len(block) != 2:
        q.fail("weight_block_size", list(block), "two positive integers [rows, columns]")
    weights: WeightFormat
    if method == "fp8":
        weights = Fp8Weights(None if block is None else (block[0], block[1]))
    elif method == "mxfp4":
        weights = Mxfp4Weights()
    elif method == "compressed-tensors":
        weights = _compressed_tensors(q)
    else:
        q.fail("quant_method", q.raw.get("quant_method"),
               f"one of the weight formats sized here ({', '.join(map(repr, MODELLED_METHODS))}); another format "
               "would be counted at the model dtype's size, so it is not supported")
    return Quantization(method=method, weights=weights, exempt=_exempt(q))


SIDECAR_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt (and Quark) checkpoints describe their format here


def refuse_sidecar_quantization(directory: Path, hf: Mapping[str, Any]) -> None:
    """A checkpoint whose weight format lives in hf_quant_config.json, not config.json's quantization_config,
    is refused in one line: read from config.json alone its weights would be counted at the model dtype."""
    text = hf.get("text_config")
    if "quantization_config" in hf or (isinstance(text, Mapping) and "quantization_config" in text):
        return
    path = directory / SIDECAR_QUANT_CONFIG
    if not path.is_file():
        return
    try:
        sidecar = parse_json_object(read_input_text(path, what="quantization sidecar"), path, what="quantization sidecar")
    except FileNotFoundError:  # removed since is_file()
        return
    section = sidecar.get("quantization", sidecar) if isinstance(sidecar, dict) else {}
    algo = section.get("quant_algo") if isinstance(section, dict) else None
    algo = algo or (sidecar.get("quant_method") if isinstance(sidecar, dict) else None)
    if algo is None:  # no weight format named (e.g. only the KV cache is quantized): the weights are the model dtype
        return
    raise ConfigError(
        f"{path} names a weight format ({algo!r}) that config.json has no quantization_config for; its weights "
        f"would be counted at the model dtype's size, so it is not supported (sized here: {', '.join(map(repr, MODELLED_METHODS))} "
        "in config.json's quantization_config)"
    )


def _compressed_tensors(q: ConfigFields) -> PackedIntWeights:
    """The one weight-only int scheme of a compressed-tensors config (pack-quantized, group or channel scales)."""
    fmt = q.text("format", default="")
    if fmt != "pack-quantized":
        q.fail("format", q.raw.get("format"), "'pack-quantized' (the compressed-tensors format sized here)")
    groups = q.section("config_groups")
    if groups is None or len(groups.raw) != 1:
        q.fail("config_groups", None if groups is None else f"{len(groups.raw)} groups", "one config group")
    key = next(iter(groups.raw))
    group = groups.section(key)
    if group is None:
        groups.fail(key, None, "a JSON object (targets, weights)")
    if group.raw.get("targets") != ["Linear"]:
        group.fail("targets", group.raw.get("targets"), "['Linear'] (every Linear module but the ignored ones)")
    if group.raw.get("input_activations") is not None:
        group.fail("input_activations", group.raw["input_activations"], "null (weight-only int quantization)")
    w = group.section("weights")
    if w is None:
        group.fail("weights", None, "a weights scheme (num_bits, type, strategy, group_size)")
    if w.text("type") != "int":
        w.fail("type", w.raw["type"], "'int'")
    bits = w.int("num_bits", high=8)
    if bits not in (4, 8):
        w.fail("num_bits", bits, "4 or 8")
    strategy = w.text("strategy")
    if strategy not in ("group", "channel"):
        w.fail("strategy", strategy, "'group' or 'channel'")
    if w.flag("dynamic") or w.has("actorder"):
        name = "dynamic" if w.flag("dynamic") else "actorder"
        w.fail(name, w.raw[name], "false / null (static scales in checkpoint order)")
    size = w.int("group_size", high=1 << 16) if strategy == "group" else None
    return PackedIntWeights(bits=bits, group_size=size, symmetric=w.flag("symmetric", default=True))


def _exempt(q: ConfigFields) -> tuple[str, ...]:
    """The modules a quantization_config leaves in the model dtype, under the names formats use."""
    exempt: list[str] = []
    for key in ("modules_to_not_convert", "ignored_layers", "ignore"):
        for i, pattern in enumerate(q.text_list(key) or ()):
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as error:
                    q.fail(f"{key}[{i}]", pattern, f"a valid regular expression after 're:' ({error})")
            exempt.append(pattern)
    return tuple(exempt)
