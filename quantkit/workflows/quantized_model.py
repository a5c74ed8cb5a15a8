"""A finished checkpoint in its staging folder: what a conversion returns, saved into place by
save."""

from __future__ import annotations

import shutil
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.common import distributed
from quantkit.common.outputs import OutputPolicy
from quantkit.errors import QuantkitError
from quantkit.formats.writer import move_into_place
from quantkit.pipeline import PipelineResult
from quantkit.recipe import Recipe
from quantkit.runtime.loader import load


@dataclass
class QuantizedModel:
    """A finished checkpoint in a staging folder; ``save`` moves it into place."""

    result: PipelineResult
    recipe: Recipe
    _saved: Path | None = None
    warnings: list[str] = field(default_factory=list)  # also in quantization_log.json
    out: Path | None = None       # the folder given to quantize(out=...): save()'s default
    inputs: dict[str, Any] = field(default_factory=dict)   # what save() never writes over (outputs.py)

    @property
    def path(self) -> Path:
        return self._saved or self.result.path

    def save(self, out: str | Path | None = None, overwrite: bool = False) -> Path:
        out = out if out is not None else self.out
        if out is None:
            raise QuantkitError("save: no output folder (pass one, or out= to quantize)")
        if self._saved is not None:
            raise QuantkitError(f"{out}: already saved to {self._saved}")
        if not distributed.is_writer():
            raise QuantkitError(f"save: rank {distributed.rank()} of a data-parallel conversion writes nothing; rank 0 saves")
        self._saved = move_into_place(self.result.path, Path(out), overwrite, OutputPolicy("convert", self.inputs))
        self._discard.detach()
        return self._saved

    def load(self, backend: str | None = None):

        return load(self.path, backend=backend)

    def summary(self) -> dict[str, Any]:
        r = self.result
        return {
            "layers": r.num_layers, "quantized_modules": r.num_quantized, "formats": r.formats,
            "bytes_before": r.bytes_before, "bytes_after": r.bytes_after, "ratio": round(r.ratio, 3),
            "seconds": round(r.seconds, 2), "peak_rss_bytes": r.peak_rss_bytes,
        }

    def __post_init__(self) -> None:
        # the staging folder goes when the object does, or at interpreter exit (a finalizer runs
        # while the modules it needs are still there, which ``__del__`` at shutdown is not promised)
        self._discard = weakref.finalize(self, shutil.rmtree, self.result.path, ignore_errors=True)
