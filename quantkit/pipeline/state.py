"""What one conversion's layers share: its inputs, its steps, its calibration data, its log.

``RunOptions`` is how the caller wants the run done; ``RunState`` is what ``run_pipeline``
opens once and every layer reads (and adds its statistics to).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from torch import nn

from quantkit.arch.spec import ArchSpec
from quantkit.formats.writer import ShardWriter
from quantkit.recipe import Recipe
from quantkit.pipeline.finite import FiniteSource
from quantkit.pipeline.memory import return_freed_memory
from quantkit.pipeline.onload import get_module
from quantkit.pipeline.resume import Boundary, LayerLog, RunBook

if TYPE_CHECKING:
    from quantkit.steps import Algorithm, Transform
    from quantkit.pipeline.passes import CalibrationPasses


@dataclass(frozen=True)
class RunOptions:
    """How ``run_pipeline`` runs, beside what it converts.

    ``warn``: told what is written but worth knowing (a statistic that is not a finite number).
    ``book``: commit each layer boundary into the staging folder; with ``book.resumed``,
    continue from that boundary (the writer, log and hidden states as they were there).
    """

    device: str = "cpu"
    progress: Callable[[Iterable, int], Iterable] | None = None   # wraps the layer loop: a progress bar
    log: Callable[[str], None] | None = None
    warn: Callable[[str], None] | None = None
    book: RunBook | None = None


@dataclass
class Calibration:
    """The calibration set as the layer loop runs it."""

    passes: CalibrationPasses
    single_pass: bool    # the whole set in memory at once: an interleaved pass can run (LayerContext)
    batch_tokens: int    # what the batches were cut with, recorded at each boundary for a resume


@dataclass
class RunState:
    """One conversion, opened: every layer reads it and adds its statistics to ``log``."""

    config: Any
    arch_name: str
    spec: ArchSpec
    model: nn.Module                # the meta skeleton; one layer is materialised at a time
    recipe: Recipe
    source: FiniteSource
    writer: ShardWriter
    options: RunOptions
    samples: list[list[int]] | None
    transforms: list[tuple[str, Transform]]
    quantizer: Algorithm
    num_tokens: int
    log: LayerLog = field(default_factory=LayerLog)
    calibration: Calibration | None = None
    offload_dir: Path | None = None   # the offloaded activations (calibration.offload), in the staging folder
    budget: int = 0                   # bytes one layer's weights may take before its experts are streamed

    @property
    def layers(self) -> nn.Module:
        return get_module(self.model, self.spec.layers)

    @property
    def resumed(self) -> Boundary | None:
        return self.options.book.resumed if self.options.book is not None else None

    @property
    def start(self) -> int:
        """The first layer this run converts (after a resumed boundary's)."""
        return self.resumed.layers_done if self.resumed is not None else 0

    @property
    def num_samples(self) -> int:
        return len(self.samples or [])

    @property
    def passes(self) -> CalibrationPasses | None:
        return self.calibration.passes if self.calibration is not None else None

    def say(self, line: str) -> None:
        if self.options.log is not None:
            self.options.log(line)

    def release(self) -> None:
        """After a written unit: the source's read buffers, reference cycles, the heap's freed pages."""
        self.source.release()
        gc.collect(1)  # tensors go by reference counting; a full collection costs ~0.2 s a layer
        return_freed_memory()
