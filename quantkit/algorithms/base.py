"""The algorithm interface: one decoder layer at a time.

An algorithm is a dataclass whose fields are its recipe options. The pipeline hands it a
``LayerContext`` (the materialised layer, its target linears with their schemes, and a way
to run the layer over the captured calibration inputs); it returns quantized weights as
plain data. Applying them (writing dequantized weights back, packing, writing shards) is
the pipeline's job, so results can be inspected, saved and reused.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import torch
from torch import nn

from ..errors import QuantkitError
from ..scheme import QuantScheme


@dataclass
class QuantizedWeight:
    """A quantized weight as plain data (docs/DESIGN.md has the layouts)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None = None
    g_idx: torch.Tensor | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    def dequantized(self, args, dtype: torch.dtype) -> torch.Tensor:
        """The weight the quantized model computes with: what the pipeline writes back."""
        from ..primitives import dequantize

        return dequantize(self.q, self.scale, self.zero_point, args, self.g_idx, dtype)


@dataclass
class LayerContext:
    """What an algorithm sees of one decoder layer.

    ``run(propagate)`` runs the layer over every captured calibration input; the pipeline
    provides it. Calibration inputs are packed into batches of rows (several samples per row,
    padding at row ends), so a hook sees ``[rows, row_len, features]`` tensors: pass them
    through ``tokens(x)`` to get the real tokens only, ``[n, features]``.

    ``single_pass`` is True when the whole calibration set fits in memory as one pass
    through the layer. ``forward(interleaved=True)`` then runs the calibration batches in
    lockstep (``quantkit.interleave``): a forward pre-hook that calls
    ``sync(key, action)`` pauses its batch until every batch has reached it, and ``action``
    runs once in between (``batch_index()`` tells the batch a hook runs for). So an
    algorithm can quantize a linear from all of its calibration inputs inside its hook,
    before the linear runs, and the rest of the layer computes on quantized outputs
    (true-sequential order at the cost of one pass). Outside an interleaved pass ``sync``
    runs ``action`` at once.

    ``forward(propagate=True)`` promises that every target linear holds its final quantized
    weight (exactly ``QuantizedWeight.dequantized``) by the time it runs in that pass; the
    pipeline then takes that pass's outputs as the next layer's inputs (and its static
    activation observations) instead of running the layer again.
    """

    index: int
    name: str
    layer: nn.Module
    targets: dict[str, tuple[nn.Linear, QuantScheme]]
    subgroups: list[list[str]]
    run: Callable[..., Any]
    num_samples: int = 0
    num_tokens: int = 0
    single_pass: bool = False
    tokens: Callable[[torch.Tensor], torch.Tensor] = field(
        default=lambda x: x.reshape(-1, x.shape[-1]))
    sync: Callable[[str, Callable[[], None]], None] = field(default=lambda key, action: action())
    batch_index: Callable[[], int | None] = field(default=lambda: None)
    propagated: bool = False

    def forward(self, propagate: bool = False, interleaved: bool = False) -> None:
        """Run the layer over every captured calibration input (hooks see the real inputs).

        With ``propagate=True`` the pass's outputs become the next layer's inputs (see the
        class docstring for the promise this makes). ``interleaved=True`` (only when
        ``single_pass``) runs the batches in lockstep at ``sync`` points.
        """
        if interleaved and not self.single_pass:
            raise RuntimeError(f"{self.name}: an interleaved pass needs the calibration set in memory (single_pass)")
        options = {"propagate": True} if propagate else {}
        if interleaved:
            options["interleaved"] = True
        self.run(**options)
        if propagate:
            self.propagated = True


class Algorithm(ABC):
    """Base class; subclasses are dataclasses registered with ``register_algorithm``."""

    name: ClassVar[str] = ""
    requires_calibration: ClassVar[bool] = False

    @abstractmethod
    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        """Quantize the target linears of one layer and return their codes and qparams."""


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str):
    """Class decorator: make a step (a dataclass) available to recipes under ``name``.

    Its recipe options are its init fields, checked strictly against their annotations
    (``quantkit.validation.build_options``): no per-class validation code.
    """

    def deco(cls):
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco


def build_algorithm(name: str, options: Mapping[str, Any] | None = None, where: str = "algorithm") -> Algorithm:
    """Instantiate a registered step from recipe options (typed, unknown keys refused)."""
    from ..validation import build_options
    from . import ensure_registered

    ensure_registered()
    if name not in ALGORITHMS:
        raise QuantkitError(f"{where}.name: unknown algorithm '{name}' (known: {', '.join(sorted(ALGORITHMS))})")
    return build_options(ALGORITHMS[name], options, where)
