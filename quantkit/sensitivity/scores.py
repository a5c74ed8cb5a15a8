"""Cheap damage scores: one forward and backward of the float model on calibration tokens.

Quantizing a Linear changes its output by ``ΔY = X ΔWᵀ``. To second order the KL of the
model's output distribution grows by ``½ ΔYᵀ F ΔY``, with ``F`` the Fisher information of the
output distribution with respect to that output; ``F = E[g gᵀ]`` for ``g`` the gradient of the
log-likelihood of a label drawn from the model itself (``labels="sampled"``: the true Fisher,
whose quadratic form is the KL's Hessian) or of the data's next token (``labels="data"``: the
empirical Fisher ModelOpt's ``auto_quantize`` uses). One backward gives ``g`` at every
position; the quadratic form is then approximated in one of three ways (``VARIANTS``):

- ``diag``:  ``Σ_t Σ_i g²ΔY²``: F's diagonal (ModelOpt's score);
- ``token``: ``Σ_t (g_t · ΔY_t)²``: F per position, features coupled;
- ``sample``: ``Σ_s (Σ_{t∈s} g_t · ΔY_t)²``: the whole sample's rank-one term;

and ``local`` is ``Σ ΔY² / Σ Y²``, the relative output error the layer loop measures, blind
to how much the rest of the model cares. Which one ranks modules like the exact KL does is a
measurement (``agreement.py``, benchmarks/RESULTS.md). Each is reported per token and with the
½, in nats, so a unit's scores add up to its predicted KL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from quantkit.pipeline.batches import CalibrationChunk

VARIANTS = ("diag", "token", "sample", "local")
SCORE_PRECISION = torch.float64   # sums over many tokens of small squares


@dataclass
class ErrorSums:
    """What one candidate format's ``ΔY`` accumulates for one Linear over the calibration tokens."""

    diag: float = 0.0
    token: float = 0.0
    sample: float = 0.0
    local: float = 0.0

    def add(self, other: "ErrorSums") -> None:
        for k in ("diag", "token", "sample", "local"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def error_terms(g: torch.Tensor, dy: torch.Tensor, samples: torch.Tensor, num_samples: int) -> ErrorSums:
    """The sums for output gradients ``g`` and output errors ``dy`` (``[n, out]``, real tokens
    only), ``samples[t]`` the calibration sample token ``t`` belongs to (``0 <= s < num_samples``)."""
    p = g.to(SCORE_PRECISION) * dy.to(SCORE_PRECISION)
    per_token = p.sum(-1)
    per_sample = torch.zeros(num_samples, dtype=SCORE_PRECISION).index_add_(0, samples, per_token)
    return ErrorSums(float(p.square().sum()), float(per_token.square().sum()), float(per_sample.square().sum()),
                     float(dy.to(SCORE_PRECISION).square().sum()))


def sample_ids(chunk: CalibrationChunk) -> tuple[torch.Tensor, int]:
    """Each position's sample index (rows hold several samples when packed) and the count."""
    rows, length = chunk.input_ids.shape
    if chunk.position_ids is None:
        return torch.arange(rows).repeat_interleave(length), rows
    starts = (chunk.position_ids == 0).reshape(-1).long()
    ids = starts.cumsum(0) - 1
    return ids, int(ids[-1]) + 1


def loss_mask(chunk: CalibrationChunk) -> torch.Tensor:
    """``[rows, len]``: the positions whose next-token distribution is scored (real tokens)."""
    return chunk.valid if chunk.valid is not None else torch.ones_like(chunk.input_ids, dtype=torch.bool)


def _labels(chunk: CalibrationChunk, logits: torch.Tensor, labels: str, gen: torch.Generator):
    """Label per position and which positions count."""
    mask = loss_mask(chunk)
    if labels == "sampled":
        probs = torch.softmax(logits.detach().float(), -1).reshape(-1, logits.shape[-1])
        y = torch.multinomial(probs, 1, generator=gen).reshape(mask.shape)
        return y, mask
    # the data's next token, inside the same sample
    y = torch.zeros_like(chunk.input_ids)
    y[:, :-1] = chunk.input_ids[:, 1:]
    keep = mask.clone()
    keep[:, -1] = False
    keep[:, :-1] &= mask[:, 1:]
    if chunk.position_ids is not None:
        keep[:, :-1] &= chunk.position_ids[:, 1:] != 0
    return y, keep


@dataclass
class GradientScores:
    """Per Linear and candidate: the summed terms, the output energy and the tokens scored."""

    sums: dict[str, dict[str, ErrorSums]] = field(default_factory=dict)
    signal: dict[str, float] = field(default_factory=dict)
    tokens: int = 0

    def score(self, members: tuple[str, ...], cand: str, variant: str) -> float:
        """A unit's predicted KL (nats per token) under one variant; ``local``: its relative error."""
        if variant == "local":
            err = sum(self.sums[m][cand].local for m in members)
            return err / max(sum(self.signal[m] for m in members), 1e-300)
        return 0.5 * sum(getattr(self.sums[m][cand], variant) for m in members) / max(self.tokens, 1)


def gradient_scores(model: nn.Module, deltas: dict[str, dict[str, torch.Tensor]], chunks: list[CalibrationChunk],
                    labels: str = "sampled", seed: int = 0,
                    progress: Callable[[int], None] | None = None) -> GradientScores:
    """One forward and backward of ``model`` per chunk; ``deltas[linear][candidate] = Wq - W``.

    Only activation gradients are taken (parameters stay frozen); each Linear's input is kept
    from its forward until its output's gradient arrives, then ``ΔY`` is formed per candidate.
    """
    if labels not in ("sampled", "data"):
        raise ValueError(f"labels must be 'sampled' or 'data', got {labels!r}")
    modules = dict(model.named_modules())
    out = GradientScores({n: {c: ErrorSums() for c in d} for n, d in deltas.items()}, {n: 0.0 for n in deltas})
    gen = torch.Generator().manual_seed(seed)
    state: dict = {}
    handles = []

    def on_forward(name):
        def hook(module, args, output):
            x = args[0].detach()
            valid = state["valid"]
            out.signal[name] += float(output.detach()[valid].to(SCORE_PRECISION).square().sum())

            def on_grad(grad):
                g = grad[valid]
                xv = x[valid]
                for cand, dw in deltas[name].items():
                    dy = xv @ dw.to(xv.dtype).T
                    out.sums[name][cand].add(error_terms(g, dy, state["samples"], state["num_samples"]))
            output.register_hook(on_grad)
        return hook

    for name in deltas:
        handles.append(modules[name].register_forward_hook(on_forward(name)))
    # the embeddings' output is where gradients start: parameters need none
    handles.append(model.get_input_embeddings().register_forward_hook(lambda m, a, o: o.requires_grad_()))
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for k, chunk in enumerate(chunks):
            ids, n = sample_ids(chunk)
            mask = loss_mask(chunk)
            state.update(valid=mask, samples=ids[mask.reshape(-1)], num_samples=n)
            kw = {} if chunk.position_ids is None else {"position_ids": chunk.position_ids}
            with torch.enable_grad():
                logits = model(input_ids=chunk.input_ids, use_cache=False, **kw).logits.float()
                y, keep = _labels(chunk, logits, labels, gen)
                loss = nn.functional.cross_entropy(logits[keep], y[keep], reduction="sum")
                loss.backward()
            out.tokens += int(keep.sum())
            del logits, loss
            if progress is not None:
                progress(k)
    finally:
        for h in handles:
            h.remove()
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
    return out
