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
import re
from typing import Annotated, Any, Literal, Mapping, get_args

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr, model_validator

from quantkit.errors import QuantkitError
from quantkit.config.validation import config, invalid, parse

# The integer widths the pack-quantized format packs into int32 words (formats/packing.py):
# compressed-tensors packs every width densely, a code straddling two words where 32 is not
# a multiple of the width.
PACKABLE_BITS = (2, 3, 4, 5, 6, 7, 8)

#: compressed-tensors' ``scale_dtype``: the dtype a checkpoint stores the scales in.
#: "torch.uint8": E8M0 exponents (the MX formats, ``numerics/e8m0.py``); "torch.float8_e4m3fn":
#: FP8 group scales under a float32 global scale (NVFP4); ``None``: the model's float dtype.
ScaleDtype = Literal["torch.uint8", "torch.float8_e4m3fn"]

# FP4 (E2M1) formats: their strategy, group size and scale dtype are fixed by the format. NVFP4
# puts a float32 global scale over FP8 group scales ("tensor_group"); MXFP4 has power-of-two
# E8M0 group scales only. Activations: NVFP4 chooses group scales per token under a global
# scale calibrated beforehand (dynamic "local"); MXFP4 chooses them per token (dynamic).
FP4_FORMATS = {"nvfp4": ("tensor_group", 16, "local", "torch.float8_e4m3fn"),
               "mxfp4": ("group", 32, True, "torch.uint8")}

Strategy = Literal["tensor", "channel", "group", "token", "tensor_group", "block"]
QuantType = Literal["int", "float"]
ActOrder = Literal["group", "weight"]
STRATEGIES = get_args(Strategy)
TYPES = get_args(QuantType)
ACTORDERS = (None, *get_args(ActOrder))


def _compiles(pattern: str) -> str:
    if pattern.startswith("re:"):
        try:
            re.compile(pattern[3:])
        except re.error as e:
            raise invalid(f"'{pattern}' is not a valid regular expression ({e})") from None
    return pattern


#: A module name, a class name, or ``re:<regex>`` on the name (compressed-tensors targets and
#: ignore entries); a regex that does not compile is refused when the config is read.
ModulePattern = Annotated[StrictStr, AfterValidator(_compiles)]


@config
class QuantArgs:
    """How one tensor is quantized.

    ``strategy`` is inferred when omitted: "group" when ``group_size`` is set, else
    "channel" for static tensors and "token" for dynamic ones. ``scale_dtype`` is inferred
    for FP4, whose format fixes it (NVFP4: "torch.float8_e4m3fn", MXFP4: "torch.uint8").
    """

    num_bits: StrictInt = 8
    type: QuantType = "int"
    symmetric: StrictBool = True
    strategy: Strategy | None = None
    group_size: Annotated[StrictInt, Field(gt=0)] | None = None
    dynamic: StrictBool | Literal["local"] = False
    actorder: ActOrder | None = None
    observer: Literal["minmax", "mse", "imatrix_mse"] = "minmax"
    block_structure: tuple[Annotated[StrictInt, Field(gt=0)], Annotated[StrictInt, Field(gt=0)]] | None = None
    scale_dtype: ScaleDtype | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "QuantArgs":
        if self.strategy is None:
            inferred = "group" if self.group_size is not None else ("token" if self.dynamic else "channel")
            if self.type == "float" and self.num_bits == 4 and self.group_size == FP4_FORMATS["nvfp4"][1]:
                inferred = FP4_FORMATS["nvfp4"][0]
            object.__setattr__(self, "strategy", inferred)  # frozen: set once, while validating
        if self.type == "int" and not 2 <= self.num_bits <= 8:
            raise invalid(f"int quantization supports 2..8 bits, got {self.num_bits}", "num_bits")
        if self.type == "float" and self.num_bits == 4:
            _check_fp4(self)
        elif self.type == "float":
            if self.num_bits != 8:
                raise invalid(f"float quantization supports 8 bits (E4M3), got {self.num_bits}", "num_bits")
            if not self.symmetric:
                raise invalid("float8 quantization must be symmetric", "symmetric")
        _check_block_and_mx(self)
        if self.strategy in ("group", "tensor_group"):
            if self.group_size is None:
                raise invalid("strategy 'group' needs a positive group_size", "group_size")
        elif self.group_size is not None:
            raise invalid(f"only valid with strategy 'group' (strategy is {self.strategy!r})", "group_size")
        if self.strategy == "tensor_group" and fp4_kind(self) != "nvfp4":
            raise invalid("'tensor_group' (group scales under a global scale) is NVFP4's", "strategy")
        if self.dynamic == "local" and fp4_kind(self) != "nvfp4":
            raise invalid("'local' (group scales under a calibrated global scale) is NVFP4's", "dynamic")
        if self.strategy == "token" and not self.dynamic:
            raise invalid("per-token quantization must be dynamic (static 'token' is impossible)", "strategy")
        if self.actorder == "group" and self.strategy != "group":
            raise invalid("'group' needs strategy 'group'", "actorder")
        return self

    # -- serialisation -------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "quant_args") -> "QuantArgs":
        return parse(cls, d, where)

    def to_dict(self) -> dict[str, Any]:
        """The compressed-tensors QuantizationArgs form."""
        return {
            "num_bits": self.num_bits,
            "type": self.type,
            "symmetric": self.symmetric,
            "group_size": self.group_size,
            "strategy": self.strategy,
            "block_structure": None if self.block_structure is None else list(self.block_structure),
            "dynamic": self.dynamic,
            "actorder": self.actorder,
            "observer": None if self.dynamic else self.observer,
            "observer_kwargs": {},
            **({} if self.scale_dtype is None else {"scale_dtype": self.scale_dtype}),
            **({"observer": "static_minmax"} if self.dynamic == "local" else {}),  # NVFP4's global input scale
        }

    @property
    def calibrated(self) -> bool:
        """Whether a scale is calibrated beforehand: a static scale, or NVFP4's global input scale."""
        return self.dynamic is not True

    @property
    def qmin(self) -> int:
        return -(1 << (self.num_bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.num_bits - 1)) - 1

    @property
    def is_mx(self) -> bool:
        """Power-of-two E8M0 scales over groups of 32 (the OCP MX formats: MXFP8, MXFP4)."""
        return self.scale_dtype == "torch.uint8"

    def check_width(self, in_features: int, where: str, out_features: int | None = None) -> None:
        """Reject a group or block size that does not divide a layer's width."""
        if self.strategy in ("group", "tensor_group") and in_features % self.group_size != 0:
            raise QuantkitError(
                f"{where}: group_size {self.group_size} does not divide in_features {in_features}"
            )
        if self.strategy == "block":
            rows, cols = self.block_structure
            if in_features % cols != 0 or (out_features is not None and out_features % rows != 0):
                raise QuantkitError(f"{where}: block_structure {list(self.block_structure)} does not divide "
                                    f"the weight [{out_features}, {in_features}] ([out, in])")


def _check_block_and_mx(a: QuantArgs) -> None:
    """Block strategy needs ``block_structure`` and nothing else does; E8M0 scales are MX only,
    FP8 scales NVFP4's."""
    if a.strategy == "block":
        if a.block_structure is None:
            raise invalid("strategy 'block' needs block_structure [rows, columns]", "block_structure")
        if a.dynamic:
            raise invalid("block scales are static (weights only)", "strategy")
    elif a.block_structure is not None:
        raise invalid(f"only valid with strategy 'block' (strategy is {a.strategy!r})", "block_structure")
    if a.is_mx and not (a.type == "float" and a.strategy == "group" and a.group_size == 32):
        raise invalid("E8M0 scales (torch.uint8) need float values in groups of 32 (MX)", "scale_dtype")
    if a.scale_dtype == "torch.float8_e4m3fn" and fp4_kind(a) != "nvfp4":
        raise invalid("FP8 (E4M3) scales under a global scale are NVFP4's", "scale_dtype")


@config
class QuantScheme:
    """Quantization of a set of modules: weights, input activations (optional)."""

    targets: tuple[ModulePattern, ...] = ("Linear",)
    weights: QuantArgs | None = None
    input_activations: QuantArgs | None = None
    output_activations: QuantArgs | None = None

    @model_validator(mode="after")
    def _supported(self) -> "QuantScheme":
        if self.weights is None and self.input_activations is None:
            raise invalid("needs 'weights' or 'input_activations'")
        if self.output_activations is not None:
            raise invalid("not supported", "output_activations")
        w, a = self.weights, self.input_activations
        if w is not None and w.dynamic:
            raise invalid("weights are quantized statically", "weights.dynamic")
        if w is not None and fp4_kind(w) is not None:
            _check_fp4_scheme(w, a)
        elif a is not None:
            _check_activations(w, a)
        if self.format == "pack-quantized" and not w.symmetric and w.strategy == "tensor":
            # one zero point for the whole tensor: quantkit's packed layout has none (its
            # zero points are packed per channel or group, as compressed-tensors packs them)
            raise invalid("asymmetric weights need strategy 'channel' or 'group' in pack-quantized, "
                          "not 'tensor'", "weights.strategy")
        return self

    @property
    def format(self) -> str:
        """The compressed-tensors format that stores this scheme."""
        w, a = self.weights, self.input_activations
        if fp4_kind(w) is not None:
            return f"{fp4_kind(w)}-pack-quantized"
        if w is not None and w.is_mx:
            return "mxfp8-quantized"
        if a is None:
            if w.type == "float":
                return "float-quantized"
            return "pack-quantized"
        if w.type == "int" and a.type == "float":
            # int weights under fp8 activations (W4AFP8): packed, as llm-compressor writes them
            # and vLLM's W4A8-FP8 scheme reads them (``weight_packed``)
            return "pack-quantized"
        return "float-quantized" if w.type == "float" else "int-quantized"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "scheme") -> "QuantScheme":
        return parse(cls, d, where)

    def to_dict(self) -> dict[str, Any]:
        return {
            "targets": list(self.targets),
            "weights": self.weights.to_dict() if self.weights else None,
            "input_activations": self.input_activations.to_dict() if self.input_activations else None,
            "output_activations": None,
            "format": self.format,
        }


def fp4_kind(args: QuantArgs | None) -> str | None:
    """"nvfp4" or "mxfp4" for FP4 (E2M1) args, else ``None``."""
    if args is None or args.type != "float" or args.num_bits != 4:
        return None
    return "nvfp4" if args.strategy == FP4_FORMATS["nvfp4"][0] else "mxfp4"


def _check_fp4(args: QuantArgs) -> None:
    """FP4 args name one of the two formats, with the format's own group size and scale dtype
    (the format's when omitted)."""
    if not args.symmetric:
        raise invalid("FP4 quantization must be symmetric", "symmetric")
    if args.strategy not in ("group", "tensor_group") or args.group_size not in (16, 32):
        raise invalid(f"FP4 groups are fixed by the format: 16 (NVFP4) or 32 (MXFP4), got {args.group_size}",
                      "group_size")
    for kind, (strategy, group, _, _) in FP4_FORMATS.items():
        if args.strategy == strategy and args.group_size != group:
            raise invalid(f"{kind.upper()} ('{strategy}') groups are {group} wide, got {args.group_size}",
                          "group_size")
    kind = fp4_kind(args)
    scale_dtype = FP4_FORMATS[kind][3]
    if args.scale_dtype is None:
        object.__setattr__(args, "scale_dtype", scale_dtype)  # frozen: set once, while validating
    elif args.scale_dtype != scale_dtype:
        raise invalid(f"{kind.upper()} scales are {scale_dtype}, got {args.scale_dtype}", "scale_dtype")


def _check_fp4_scheme(w: QuantArgs, a: QuantArgs | None) -> None:
    """FP4 weights with FP4 activations of the same format, scaled as the format scales them."""
    if a is None:
        return
    kind = fp4_kind(w)
    if fp4_kind(a) != kind:
        raise invalid(f"{kind.upper()} weights take {kind.upper()} activations or none", "input_activations")
    dynamic = FP4_FORMATS[kind][2]
    if a.dynamic != dynamic:
        how = ("group scales chosen per token under a global scale calibrated beforehand"
               if dynamic == "local" else "group scales chosen per token")
        raise invalid(f"{kind.upper()} activations need {dynamic!r} ({how}), got {a.dynamic!r}",
                      "input_activations.dynamic")


def _check_activations(w: QuantArgs | None, a: QuantArgs) -> None:
    """The weight x activation pairs quantkit computes: W8A8 (int8 or fp8, per tensor or
    channel), fp8 blocks or MX groups with fp8 activations per token group, and int weights
    under 8 bits (W4A8, W4AFP8) with 8-bit activations per token."""
    if a.strategy in ("channel", "block") or (a.strategy == "group" and not (a.dynamic and a.type == "float")):
        raise invalid(f"'{a.strategy}' is not supported for activations", "input_activations.strategy")
    if w is None or a.num_bits != 8:
        raise invalid("only 8-bit activations with quantized weights are supported", "input_activations")
    if a.is_mx != w.is_mx:
        raise invalid("MX (E8M0) activation scales go with MX weights only", "input_activations.scale_dtype")
    if w.type == "int" and w.num_bits < 8:
        if a.strategy != "token":
            raise invalid(f"int{w.num_bits} weights take activations per token", "input_activations.strategy")
        if not (a.symmetric and w.symmetric):
            raise invalid(f"W{w.num_bits}A8 must be symmetric", "input_activations.symmetric")
        return
    if w.type == "float" and (w.strategy == "block" or w.is_mx):
        if a.type != "float":
            raise invalid("fp8 block or MX weights take fp8 activations", "input_activations.type")
        return
    if w.num_bits != 8 or w.type != a.type:
        raise invalid("only W8A8 (int8 x int8 or fp8 x fp8) is supported", "input_activations")
    if w.strategy == "group":
        raise invalid("W8A8 weights must be per tensor or per channel", "weights.strategy")
    if a.strategy == "group":
        raise invalid("activations per token group need fp8 block or MX weights", "input_activations.strategy")
    if w.type == "int" and not (a.symmetric and w.symmetric):
        raise invalid("int8 W8A8 must be symmetric", "input_activations.symmetric")


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
    "NVFP4A16": _preset(QuantArgs(num_bits=4, type="float", group_size=16)),
    "NVFP4": _preset(
        QuantArgs(num_bits=4, type="float", group_size=16),
        QuantArgs(num_bits=4, type="float", group_size=16, dynamic="local"),
    ),
    "MXFP4A16": _preset(QuantArgs(num_bits=4, type="float", group_size=32)),
    "MXFP4": _preset(
        QuantArgs(num_bits=4, type="float", group_size=32),
        QuantArgs(num_bits=4, type="float", group_size=32, dynamic=True),
    ),
    # As compressed-tensors defines them (quantization/quant_scheme.py).
    "FP8_BLOCK": _preset(
        QuantArgs(num_bits=8, type="float", strategy="block", block_structure=(128, 128)),
        QuantArgs(num_bits=8, type="float", group_size=128, dynamic=True),
    ),
    "MXFP8A16": _preset(QuantArgs(num_bits=8, type="float", group_size=32, scale_dtype="torch.uint8")),
    "MXFP8": _preset(
        QuantArgs(num_bits=8, type="float", group_size=32, scale_dtype="torch.uint8"),
        QuantArgs(num_bits=8, type="float", group_size=32, dynamic=True, scale_dtype="torch.uint8"),
    ),
    "W4AFP8": _preset(QuantArgs(num_bits=4, group_size=128),
                      QuantArgs(num_bits=8, type="float", strategy="token", dynamic=True)),
    "W4A8": _preset(QuantArgs(num_bits=4, group_size=128), QuantArgs(num_bits=8, strategy="token", dynamic=True)),
    **{f"W{b}A16": _preset(QuantArgs(num_bits=b, group_size=128)) for b in (2, 3, 5, 6, 7)},
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
