"""Candidate formats of a mixed-precision plan, and what each costs in the checkpoint.

A candidate is a weight-only format (``QuantArgs``) or ``None``: the module kept in the
checkpoint's own dtype (listed in ``ignore``). Its cost is the exact size of the tensors the
format writes for one Linear (``formats/compressed_tensors.py``): codes, scales in the
checkpoint's dtype, zero points packed as the format packs them, ``weight_shape``, ``g_idx``.
Biases cost the same in every format and are left out. So with float32 scales W4 g64 costs
4 + 32 / 64 = 4.5 bits per weight (plus 128 bits of ``weight_shape`` per module):

    >>> w4 = CANDIDATES["W4_G64"]
    >>> round(bits_per_weight(w4, 576, 576, torch.float32), 4), bits_per_weight(None, 8, 8, torch.bfloat16)
    (4.5004, 16.0)

FP4 packs two codes a byte with one byte per group scale: NVFP4 (groups of 16) 4.5 bits, MXFP4
(groups of 32) 4.25 bits per weight.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Mapping

import torch
from pydantic import BeforeValidator, StrictStr, model_validator

from quantkit.errors import QuantkitError
from quantkit.config.scheme import QuantArgs, QuantScheme, fp4_kind
from quantkit.config.validation import config, invalid, parse

#: The named candidates a recipe may list (symmetric int, min-max ranges unless the recipe's own
#: weights say otherwise: see ``like``). ``KEEP`` keeps the module in the checkpoint's dtype.
CANDIDATES: dict[str, QuantArgs | None] = {
    "W4_G128": QuantArgs(num_bits=4, group_size=128),
    "W4_G64": QuantArgs(num_bits=4, group_size=64),
    "W4_G32": QuantArgs(num_bits=4, group_size=32),
    "W8_CHANNEL": QuantArgs(num_bits=8, strategy="channel"),
    "KEEP": None,
}
DEFAULT_CANDIDATES = ("W4_G128", "W4_G64", "W4_G32", "W8_CHANNEL", "KEEP")


def _named(value: Any) -> Any:
    if isinstance(value, str):
        key = value.upper()
        if key not in CANDIDATES:
            raise invalid(f"unknown candidate '{value}' (known: {', '.join(CANDIDATES)}; or a mapping "
                          "{name: ..., weights: {...}})")
        args = CANDIDATES[key]
        return {"name": key, "weights": None if args is None else dataclasses.asdict(args)}
    return value


@config
class _Candidate:
    name: StrictStr
    weights: QuantArgs | None = None   # None: kept in the checkpoint's dtype

    @model_validator(mode="after")
    def _writable(self) -> "_Candidate":
        if self.weights is not None:
            try:
                QuantScheme(("Linear",), self.weights)   # a format quantkit writes (packable widths, ...)
            except QuantkitError as e:
                raise invalid(str(e)) from None
        return self


#: A candidate in a recipe: a name from ``CANDIDATES`` or ``{name: ..., weights: {...}}``.
Candidate = Annotated[_Candidate, BeforeValidator(_named)]


def candidate(name: str) -> _Candidate:
    """A named candidate: ``candidate("W8_CHANNEL").weights.num_bits == 8``."""
    return _Candidate(**_named(name))


def like(c: _Candidate, base: QuantArgs | None) -> _Candidate:
    """``c`` with the range observer and activation order of the recipe's own weights ``base``
    (a GPTQ recipe with ``observer: mse`` plans every format with them), where they apply."""
    if c.weights is None or base is None or base.type != c.weights.type:
        return c
    actorder = base.actorder if base.actorder != "group" or c.weights.strategy == "group" else None
    return dataclasses.replace(c, weights=dataclasses.replace(c.weights, observer=base.observer, actorder=actorder))


def fits(args: QuantArgs | None, in_features: int) -> bool:
    """Whether the format can store a Linear this wide (a group size must divide it)."""
    return args is None or args.strategy != "group" or in_features % args.group_size == 0


def weight_bytes(args: QuantArgs | None, out_features: int, in_features: int, dtype: torch.dtype) -> int:
    """Bytes of one Linear's weight tensors in the format (see the module docstring)."""
    elt = torch.empty(0, dtype=dtype).element_size()
    if args is None:
        return out_features * in_features * elt
    n_scales = {"tensor": 1, "channel": out_features}.get(args.strategy)
    if args.strategy == "block":
        n_scales = (out_features // args.block_structure[0]) * (in_features // args.block_structure[1])
    elif n_scales is None:   # group, tensor_group
        n_scales = out_features * (in_features // args.group_size)
    if fp4_kind(args) is not None:
        # two E2M1 codes a byte (weight_packed uint8), one byte per group scale (FP8 or E8M0),
        # NVFP4's float32 weight_global_scale
        return out_features * in_features // 2 + n_scales + (4 if fp4_kind(args) == "nvfp4" else 0)
    size = n_scales * (1 if args.is_mx else elt)   # MX scales: one E8M0 byte each
    if args.type == "float":
        size += out_features * in_features   # float8 codes, one byte each
    else:
        words = math.ceil(in_features * args.num_bits / 32)
        size += out_features * words * 4 + 2 * 8   # weight_packed int32, weight_shape int64[2]
        if not args.symmetric:   # zero points packed along dim 0, like the codes
            size += math.ceil(out_features * args.num_bits / 32) * 4 * (n_scales // out_features or 1)
    if args.actorder == "group":
        size += in_features * 4   # weight_g_idx int32
    return size


def bits_per_weight(args: QuantArgs | None, out_features: int, in_features: int, dtype: torch.dtype) -> float:
    return 8 * weight_bytes(args, out_features, in_features, dtype) / (out_features * in_features)


def check_candidates(cands: "list[_Candidate]", where: str) -> None:
    names = [c.name for c in cands]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise QuantkitError(f"{where}: candidate '{dup}' is listed twice")
    if len(cands) < 2:
        raise QuantkitError(f"{where}: a plan needs at least two candidates, got {len(cands)}")


def candidates_from(spec: "list[str | Mapping] | None", base: QuantArgs | None, where: str) -> list[_Candidate]:
    """Candidates from a recipe's list (names or mappings; the defaults when None)."""

    raw = list(DEFAULT_CANDIDATES) if spec is None else list(spec)
    cands = [like(parse(Candidate, c, f"{where}[{i}]"), base) for i, c in enumerate(raw)]
    check_candidates(cands, where)
    return cands
