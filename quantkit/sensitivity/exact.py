"""The ground truth: the KL of the output distribution with one unit quantized, the rest float.

``KL(p_float || p_quant)`` per real calibration token, averaged: what the evaluation's
``kl_mean`` measures, on calibration text. It costs a model pass per unit and format, so it
grades the cheap scores on a sample of units (``agreement.py``) rather than being the search.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from quantkit.pipeline.batches import CalibrationChunk
from quantkit.sensitivity.scores import loss_mask

#: Reference log-probabilities are kept when they fit this many floats (1 GiB), else the
#: reference logits are recomputed from the float model's final hidden states.
CACHE_FLOATS = 1 << 28


@contextmanager
def substituted(model: nn.Module, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """``model`` with the named Linears' weights replaced for the duration."""
    modules = dict(model.named_modules())
    saved = {n: modules[n].weight.data for n in weights}
    try:
        for n, w in weights.items():
            modules[n].weight.data = w.to(saved[n].dtype)
        yield
    finally:
        for n, w in saved.items():
            modules[n].weight.data = w


def _logprobs(model: nn.Module, chunk: CalibrationChunk) -> torch.Tensor:
    kw = {} if chunk.position_ids is None else {"position_ids": chunk.position_ids}
    logits = model(input_ids=chunk.input_ids, use_cache=False, **kw).logits
    return torch.log_softmax(logits[loss_mask(chunk)].float(), -1)


class ExactKL:
    """KL of ``model`` (as it is when called) against its float self, on ``chunks``."""

    def __init__(self, model: nn.Module, chunks: list[CalibrationChunk]):
        self.model, self.chunks = model, chunks
        vocab = model.get_output_embeddings().weight.shape[0]
        tokens = sum(int(loss_mask(c).sum()) for c in chunks)
        self.tokens = tokens
        with torch.no_grad():
            self._ref = [_logprobs(model, c) for c in chunks] if tokens * vocab <= CACHE_FLOATS else None

    def reference(self, k: int) -> torch.Tensor:
        if self._ref is not None:
            return self._ref[k]
        return _logprobs(self.model, self.chunks[k])   # the float model: called before substituting

    def __call__(self, weights: dict[str, torch.Tensor]) -> float:
        """Mean KL per token with ``weights`` (Linear name -> weight) substituted."""
        total = 0.0
        with torch.no_grad():
            for k, chunk in enumerate(self.chunks):
                ref = self.reference(k)
                with substituted(self.model, weights):
                    lq = _logprobs(self.model, chunk)
                total += float((ref.exp() * (ref - lq)).sum(-1).double().sum())
        return total / max(self.tokens, 1)
