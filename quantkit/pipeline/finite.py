"""Non-finite weights refused as they are read.

A NaN or inf in a weight quantizes into a scale of NaN (or a whole row rounded to zero) and
the checkpoint is garbage with nothing said; every tensor the pipeline reads goes through
``FiniteSource``, so the model is read once and the check costs one pass over each tensor.
"""

from __future__ import annotations

import torch

from quantkit.errors import QuantkitError

#: Elements checked at a time: the masks ``isfinite`` and ``isnan`` make stay small beside an
#: embedding of hundreds of millions of elements.
CHUNK = 1 << 24

#: Float types without ``isfinite`` on the CPU: their chunks are widened first.
_WIDENED = (torch.float8_e4m3fn, torch.float8_e5m2)


def nonfinite_counts(t: torch.Tensor) -> tuple[int, int]:
    """How many NaN and how many infinite values the floating tensor ``t`` holds."""
    flat = t.reshape(-1)
    nan = inf = 0
    for start in range(0, flat.numel(), CHUNK):
        chunk = flat[start:start + CHUNK]
        if chunk.dtype in _WIDENED:
            chunk = chunk.float()
        if bool(torch.isfinite(chunk).all()):
            continue
        nan += int(torch.isnan(chunk).sum())
        inf += int(torch.isinf(chunk).sum())
    return nan, inf


def check_finite(t: torch.Tensor, name: str, where: str) -> None:
    """Refuse (``QuantkitError``) tensor ``name`` of file ``where`` when it holds NaN or inf."""
    if not t.is_floating_point():
        return
    nan, inf = nonfinite_counts(t)
    if nan or inf:
        raise QuantkitError(f"{where}: tensor '{name}' has {nan} NaN and {inf} inf values; quantkit does not "
                            "quantize non-finite weights")


class FiniteSource:
    """A tensor source (``source.py``) whose ``get`` refuses floating tensors holding NaN or inf;
    everything else is the wrapped source's."""

    def __init__(self, source):
        self._source = source

    def get(self, name: str) -> torch.Tensor:
        t = self._source.get(name)
        check_finite(t, name, self._source.where(name))
        return t

    def get_slab(self, name: str, index: int) -> torch.Tensor:
        t = self._source.get_slab(name, index)
        check_finite(t, name, self._source.where(name))
        return t

    def __contains__(self, name: str) -> bool:
        return name in self._source

    def __getattr__(self, attr: str):
        return getattr(self._source, attr)
