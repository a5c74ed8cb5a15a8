"""Quantization arguments and schemes, validated on construction.

``QuantArgs`` describes how one tensor (weights, input activations) is quantized;
``QuantScheme`` groups them for a set of target modules. Field names and meanings match
compressed-tensors' ``QuantizationArgs`` so a scheme serialises straight into a
checkpoint's ``quantization_config``.

Example:
    >>> w4 = QuantArgs(num_bits=4, group_size=64)          # strategy inferred: "group"
    >>> PRESETS["W8A8"].input_activations.strategy
    'token'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import QuantkitError

STRATEGIES = ("tensor", "channel", "group", "token")
TYPES = ("int", "float")
ACTORDERS = (None, "group", "weight")


def _reject_unknown(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise QuantkitError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")


@dataclass(frozen=True)
class QuantArgs:
    """How one tensor is quantized.

    ``strategy`` is inferred when omitted: "group" when ``group_size`` is set, else
    "channel" for static tensors and "token" for dynamic ones.
    """

    num_bits: int = 8
    type: str = "int"
    symmetric: bool = True
    strategy: str | None = None
    group_size: int | None = None
    dynamic: bool = False
    actorder: str | None = None
    observer: str = "minmax"

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise QuantkitError(f"type: must be one of {TYPES}, got {self.type!r}")
        if self.strategy is None:
            inferred = "group" if self.group_size else ("token" if self.dynamic else "channel")
            object.__setattr__(self, "strategy", inferred)
        if self.strategy not in STRATEGIES:
            raise QuantkitError(f"strategy: must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.type == "int" and not 2 <= self.num_bits <= 8:
            raise QuantkitError(f"num_bits: int quantization supports 2..8 bits, got {self.num_bits}")
        if self.type == "float":
            if self.num_bits != 8:
                raise QuantkitError(f"num_bits: float quantization supports 8 bits (E4M3), got {self.num_bits}")
            if not self.symmetric:
                raise QuantkitError("symmetric: float8 quantization must be symmetric")
        if self.strategy == "group":
            if not isinstance(self.group_size, int) or self.group_size <= 0:
                raise QuantkitError(f"group_size: strategy 'group' needs a positive group_size, got {self.group_size!r}")
        elif self.group_size is not None:
            raise QuantkitError(f"group_size: only valid with strategy 'group' (strategy is {self.strategy!r})")
        if self.strategy == "token" and not self.dynamic:
            raise QuantkitError("strategy: per-token quantization must be dynamic (static 'token' is impossible)")
        if self.actorder not in ACTORDERS:
            raise QuantkitError(f"actorder: must be 'group', 'weight' or null, got {self.actorder!r}")
        if self.actorder == "group" and self.strategy != "group":
            raise QuantkitError("actorder: 'group' needs strategy 'group'")
        if self.observer not in ("minmax", "mse"):
            raise QuantkitError(f"observer: must be 'minmax' or 'mse', got {self.observer!r}")

    # -- serialisation -------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "quant_args") -> "QuantArgs":
        if not isinstance(d, Mapping):
            raise QuantkitError(f"{where}: expected a mapping, got {type(d).__name__}")
        allowed = {f.name for f in dataclasses.fields(cls)}
        _reject_unknown(d, allowed, where)
        try:
            return cls(**dict(d))
        except QuantkitError as e:
            raise QuantkitError(f"{where}.{e}") from None
        except TypeError as e:
            raise QuantkitError(f"{where}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The compressed-tensors QuantizationArgs form."""
        return {
            "num_bits": self.num_bits,
            "type": self.type,
            "symmetric": self.symmetric,
            "group_size": self.group_size,
            "strategy": self.strategy,
            "block_structure": None,
            "dynamic": self.dynamic,
            "actorder": self.actorder,
            "observer": None if self.dynamic else self.observer,
            "observer_kwargs": {},
        }

    @property
    def qmin(self) -> int:
        return -(1 << (self.num_bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.num_bits - 1)) - 1

    def check_width(self, in_features: int, where: str) -> None:
        """Reject a group size that does not divide a layer's input width."""
        if self.strategy == "group" and in_features % self.group_size != 0:
            raise QuantkitError(
                f"{where}: group_size {self.group_size} does not divide in_features {in_features}"
            )


@dataclass(frozen=True)
class QuantScheme:
    """Quantization of a set of modules: weights, input activations (optional)."""

    targets: tuple[str, ...] = ("Linear",)
    weights: QuantArgs | None = None
    input_activations: QuantArgs | None = None
    output_activations: QuantArgs | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.weights is None and self.input_activations is None:
            raise QuantkitError("scheme: needs 'weights' or 'input_activations'")
        if self.output_activations is not None:
            raise QuantkitError("output_activations: not supported")
        w, a = self.weights, self.input_activations
        if w is not None and w.dynamic:
            raise QuantkitError("weights.dynamic: weights are quantized statically")
        if a is not None:
            if a.strategy in ("group", "channel"):
                raise QuantkitError(f"input_activations.strategy: '{a.strategy}' is not supported for activations")
            if w is None or w.num_bits != 8 or a.num_bits != 8 or w.type != a.type:
                raise QuantkitError(
                    "input_activations: only W8A8 (int8 x int8 or fp8 x fp8) is supported"
                )
            if w.strategy == "group":
                raise QuantkitError("weights.strategy: W8A8 weights must be per tensor or per channel")
            if w.type == "int" and not (a.symmetric and w.symmetric):
                raise QuantkitError("input_activations.symmetric: int8 W8A8 must be symmetric")

    @property
    def format(self) -> str:
        """The compressed-tensors format that stores this scheme."""
        w, a = self.weights, self.input_activations
        if a is None:
            if w.type == "float":
                return "float-quantized"
            return "pack-quantized"
        return "float-quantized" if w.type == "float" else "int-quantized"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "scheme") -> "QuantScheme":
        if not isinstance(d, Mapping):
            raise QuantkitError(f"{where}: expected a mapping, got {type(d).__name__}")
        _reject_unknown(d, {"targets", "weights", "input_activations", "output_activations", "format"}, where)
        targets = d.get("targets", ["Linear"])
        if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
            raise QuantkitError(f"{where}.targets: expected a list of strings")

        def args(key: str) -> QuantArgs | None:
            v = d.get(key)
            return None if v is None else QuantArgs.from_dict(v, f"{where}.{key}")

        try:
            return cls(tuple(targets), args("weights"), args("input_activations"), args("output_activations"))
        except QuantkitError as e:
            msg = str(e)
            raise QuantkitError(msg if msg.startswith(where) else f"{where}.{msg}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "targets": list(self.targets),
            "weights": self.weights.to_dict() if self.weights else None,
            "input_activations": self.input_activations.to_dict() if self.input_activations else None,
            "output_activations": None,
            "format": self.format,
        }


def _preset(weights: QuantArgs, acts: QuantArgs | None = None) -> QuantScheme:
    return QuantScheme(("Linear",), weights, acts)


PRESETS: dict[str, QuantScheme] = {
    "W4A16": _preset(QuantArgs(num_bits=4, group_size=128)),
    "W4A16_ASYM": _preset(QuantArgs(num_bits=4, group_size=128, symmetric=False)),
    "W8A16": _preset(QuantArgs(num_bits=8, strategy="channel")),
    "W8A8": _preset(QuantArgs(num_bits=8, strategy="channel"), QuantArgs(num_bits=8, strategy="token", dynamic=True)),
    "FP8": _preset(
        QuantArgs(num_bits=8, type="float", strategy="tensor"),
        QuantArgs(num_bits=8, type="float", strategy="tensor"),
    ),
    "FP8_DYNAMIC": _preset(
        QuantArgs(num_bits=8, type="float", strategy="channel"),
        QuantArgs(num_bits=8, type="float", strategy="token", dynamic=True),
    ),
}


def preset(name: str) -> QuantScheme:
    """Look up a preset scheme by name (case-insensitive)."""
    key = name.upper()
    if key not in PRESETS:
        raise QuantkitError(f"scheme: unknown preset '{name}' (known: {', '.join(PRESETS)})")
    return PRESETS[key]


def with_group_size(scheme: QuantScheme, group_size: int) -> QuantScheme:
    """A copy of ``scheme`` whose weights use ``group_size``."""
    w = dataclasses.replace(scheme.weights, group_size=group_size, strategy="group")
    return dataclasses.replace(scheme, weights=w)
