"""The layer-step interface: one decoder layer at a time, a chain of steps per layer.

A recipe's ``steps`` are modifiers, each a dataclass whose fields are its recipe options,
registered with ``register_algorithm``. Two kinds:

- a **transform** (``Transform``: AWQ, SmoothQuant) may change any parameter of the layer
  (norms, biases, producer linears) as long as the float layer computes the same function.
  Its ``search(ctx)`` returns plain data (``TransformResult``: tensors plus a JSON summary);
  ``apply(ctx, result)`` is a separate step, so a result can be saved and re-applied
  without searching again.
- a **quantizer** (``Algorithm``: RTN, GPTQ) returns quantized weights of the target linears
  as plain data. Writing the dequantized weights back, packing and writing is the
  pipeline's job.

A chain is zero or more transforms followed by one quantizer (RTN when the recipe names
none). After the chain, the pipeline writes every tensor of the layer from the layer in
memory, never from the source checkpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

import torch
from torch import nn

from quantkit.errors import QuantkitError
from quantkit.config.scheme import QuantScheme
from quantkit.numerics.number_formats import QParams, number_format
from quantkit.config.validation import build_options

if TYPE_CHECKING:
    from quantkit.arch.spec import ArchSpec


@dataclass
class QuantizedWeight:
    """A quantized weight as plain data (docs/DESIGN.md has the layouts)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None = None
    g_idx: torch.Tensor | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    global_scale: torch.Tensor | None = None   # a per-tensor scale over the group scales, in formats with one

    @property
    def qparams(self) -> QParams:
        """The scales as the number-format contract takes them."""
        return QParams(self.scale, self.zero_point, self.global_scale)

    def dequantized(self, args, dtype: torch.dtype) -> torch.Tensor:
        """The weight the quantized model computes with: what the pipeline writes back."""
        return number_format(args).dequantize(self.q, self.qparams, self.g_idx, dtype)


@dataclass
class LayerContext:
    """What an algorithm sees of one decoder layer.

    ``run(propagate)`` runs the layer over every captured calibration input; the pipeline
    provides it. Calibration inputs are packed into batches of rows (several samples per row,
    padding at row ends), so a hook sees ``[rows, row_len, features]`` tensors: pass them
    through ``tokens(x)`` to get the real tokens only, ``[n, features]``.

    ``single_pass`` is True when the whole calibration set fits in memory as one pass
    through the layer. ``forward(interleaved=True)`` then runs the calibration batches in
    lockstep (``quantkit.pipeline.interleave``): a forward pre-hook that calls
    ``sync(key, action)`` pauses its batch until every batch has reached it, and ``action``
    runs once in between (``batch_index()`` tells the batch a hook runs for). So an
    algorithm can quantize a linear from all of its calibration inputs inside its hook,
    before the linear runs, and the rest of the layer computes on quantized outputs
    (true-sequential order at the cost of one pass). Outside an interleaved pass ``sync``
    runs ``action`` at once. ``sync(key, action, park=(x,))`` lets the pipeline park ``x``
    (the hook's input) out of memory while its batch waits; ``action`` must not read any
    batch's tensors, only what the hooks accumulated.

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
    arch: "ArchSpec | None" = None    # the architecture table's entry (mappings, norm offset)
    config: Any = None                # the model's transformers config (head counts)
    num_batches: int = 0
    tokens: Callable[[torch.Tensor], torch.Tensor] = field(
        default=lambda x: x.reshape(-1, x.shape[-1]))
    # sync(key, action, park=(tensors,)): ``park`` names the pausing batch's tensors that may be
    # moved out of memory until it resumes (with ``calibration.offload``; pipeline/park.py)
    sync: Callable[..., None] = field(default=lambda key, action, park=(): action())
    batch_index: Callable[[], int | None] = field(default=lambda: None)
    propagated: bool = False
    # input absmax of static-activation targets, recorded by a propagating pass
    observed: dict[str, torch.Tensor] = field(default_factory=dict)
    # forward_float(): the layer, as it is, over the float model's inputs of this layer (every batch;
    # hooks see them), its outputs kept as the float model's next inputs. None unless the quantizer
    # asks the run to carry them (``Algorithm.needs_float_inputs``: GPTAQ)
    forward_float: Callable[[], None] | None = None

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


    def forward_batches(self, batches: "list[int] | None" = None) -> None:
        """Run the layer over some calibration batches (all when None), nothing propagated.

        A hook that needs to know which batch it sees calls ``batch_index()``. Transforms use
        this to observe activation statistics and capture sub-module inputs for replay.
        """
        self.run(batches=batches)


@dataclass
class TransformResult:
    """What a transform's search found for one layer, as plain data.

    ``tensors``: what ``apply`` needs (scales per mapping, clip ranges per linear), saved to
    the output's transforms file; ``summary``: JSON-serialisable figures (chosen ratio or
    alpha, loss before and after) for ``quantization_log.json``.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


class Step(ABC):
    """A modifier of one decoder layer; subclasses are dataclasses (their fields: recipe options)."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "quantizer"   # or "transform"
    requires_calibration: ClassVar[bool] = False
    must_be_first: ClassVar[bool] = False   # the recipe refuses it anywhere but steps[0]


class Algorithm(Step):
    """A quantizer: the last step of a layer's chain."""

    kind: ClassVar[str] = "quantizer"

    @property
    def needs_float_inputs(self) -> bool:
        """The run carries the float model's layer inputs beside the quantized ones
        (``LayerContext.forward_float``): twice the calibration activations."""
        return False

    @abstractmethod
    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        """Quantize the target linears of one layer and return their codes and qparams."""


class Transform(Step):
    """A function-preserving change of the layer's float parameters, searched then applied."""

    kind: ClassVar[str] = "transform"
    requires_calibration: ClassVar[bool] = True
    folds_scales: ClassVar[bool] = False   # folds per-channel scales where the architecture's mappings say

    @abstractmethod
    def search(self, ctx: LayerContext) -> TransformResult:
        """Find the transform for this layer (the layer is left unchanged)."""

    @abstractmethod
    def apply(self, ctx: LayerContext, result: TransformResult) -> None:
        """Change the layer's parameters as ``result`` says."""


ALGORITHMS: dict[str, type[Step]] = {}


def register_algorithm(name: str):
    """Class decorator: make a step (a dataclass) available to recipes under ``name``.

    Its recipe options are its init fields, checked strictly against their annotations
    (``quantkit.config.validation.build_options``): no per-class validation code.
    """

    def deco(cls):
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco


def build_algorithm(name: str, options: Mapping[str, Any] | None = None, where: str = "algorithm") -> Step:
    """Instantiate a registered step from recipe options (typed, unknown keys refused)."""
    if name not in ALGORITHMS:
        raise QuantkitError(f"{where}.name: unknown algorithm '{name}' (known: {', '.join(sorted(ALGORITHMS))})")
    return build_options(ALGORITHMS[name], options, where)
