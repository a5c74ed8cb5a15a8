"""Signed gradient descent over rounding offsets and clip factors, free of any model or format.

Cheng et al., "Optimize Weight Rounding via Signed Gradient Descent for the Quantization of
LLMs" (2023). Each target weight ``W`` of a block gets a rounding offset ``V`` per element and,
per scale group, clip factors ``alpha`` (on the group's minimum) and ``beta`` (on its maximum).
The quantized block computes with

    W~ = s * (clamp(round(W / s + V) + zp, qmin, qmax) - zp),   (s, zp) from (alpha * min, beta * max)

(the number format's fake-quantization gives ``W~``), ``round`` passing gradients straight through, and
the loss is the mean squared error of the block's output against the float block's on the
calibration rows, ``L = ||f(X; W~) - f(X; W)||^2``. Each step draws ``batch_size`` rows at random
and moves every parameter by the sign of its gradient,

    theta <- clamp(theta - lr_t * sign(dL/dtheta)),   lr_t = lr * (1 - t / iters),

with ``V`` in [-0.5, 0.5] and ``alpha, beta`` in [0.5, 1] (the paper's ranges). The parameters
kept are those of the step whose loss was the lowest: the first step is round to nearest
(``V = 0``) on the starting ranges, min-max (``alpha = beta = 1``) unless a search chose others.

Example:
    >>> import torch
    >>> target = torch.tensor([0.3, -0.7])
    >>> p = torch.zeros(2, requires_grad=True)
    >>> res = sign_sgd([p], lambda step: (p - target).pow(2).sum(), SignRoundSettings(iters=100),
    ...                clamp=lambda: p.data.clamp_(*V_RANGE))
    >>> [round(x, 2) for x in p.tolist()], res.best_loss < res.first_loss
    ([0.3, -0.5], True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

V_RANGE = (-0.5, 0.5)          # a rounding offset moves a value at most half a step either way
CLIP_RANGE = (0.5, 1.0)        # a clip factor keeps at least half of the group's range


@dataclass(frozen=True)
class SignRoundSettings:
    """The optimisation's settings; ``lr`` None is ``1 / iters`` (AutoRound's default)."""

    iters: int = 200
    lr: float | None = None
    batch_size: int = 8
    minmax: bool = True        # learn the clip factors too (else only the rounding offsets)
    seed: int = 0

    @property
    def step_size(self) -> float:
        return self.lr if self.lr is not None else 1.0 / self.iters


@dataclass
class RoundingParams:
    """One weight's learned parameters: ``v`` ``[out, in]``, clip factors in its scales' shape."""

    v: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    #: the clip factors' upper bound: 1, or a wider start's own factor (a search may start a group
    #: above its range; learning may then narrow it but not widen it further)
    top: torch.Tensor | float = 1.0

    @classmethod
    def start(cls, shape: tuple[int, ...], scale_shape: tuple[int, ...], minmax: bool,
              clip: torch.Tensor | None = None) -> RoundingParams:
        """Round to nearest on min-max ranges, or on the ranges ``clip`` (one factor per scale,
        at least ``CLIP_RANGE``'s lower end) makes of them; the clip factors learn only with ``minmax``."""
        if clip is None:
            start, top = torch.ones(scale_shape), CLIP_RANGE[1]
        else:
            start = clip.detach().float().reshape(scale_shape).clamp_min(CLIP_RANGE[0])
            top = start.clamp_min(CLIP_RANGE[1])
        p = cls(torch.zeros(shape), start.clone(), start.clone(), top)
        p.v.requires_grad_(True)
        if minmax:
            p.alpha.requires_grad_(True)
            p.beta.requires_grad_(True)
        return p

    def learned(self) -> list[torch.Tensor]:
        return [t for t in (self.v, self.alpha, self.beta) if t.requires_grad]

    def clamp_(self) -> None:
        with torch.no_grad():
            self.v.clamp_(*V_RANGE)
            for clip in (self.alpha, self.beta):
                clip.clamp_min_(CLIP_RANGE[0])
                if isinstance(self.top, torch.Tensor):
                    torch.minimum(clip, self.top, out=clip)
                else:
                    clip.clamp_max_(self.top)


@dataclass
class SignRoundResult:
    """Figures of one optimisation: losses of the first, the best and the last step."""

    first_loss: float
    best_loss: float
    last_loss: float
    best_step: int
    steps: int


def sign_sgd(params: list[torch.Tensor], loss_of: Callable[[int], torch.Tensor], settings: SignRoundSettings,
             clamp: Callable[[], None] | None = None) -> SignRoundResult:
    """Minimise ``loss_of(step)`` over ``params`` (leaf tensors, changed in place) by signed
    gradient descent with a linearly decaying step; leaves ``params`` at the lowest loss seen.

    ``clamp`` projects the parameters back into their range after each step.
    """
    lr = settings.step_size
    best = [p.detach().clone() for p in params]
    first = best_loss = last = float("inf")
    best_step = 0
    for step in range(settings.iters):
        with torch.enable_grad():
            loss = loss_of(step)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        last = float(loss.detach())
        if step == 0:
            first = last
        if last < best_loss:
            best_loss, best_step = last, step
            for b, p in zip(best, params):
                b.copy_(p.detach())
        rate = lr * (1.0 - step / settings.iters)
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None:
                    p.sub_(torch.sign(g), alpha=rate)
        if clamp is not None:
            clamp()
    with torch.no_grad():
        for b, p in zip(best, params):
            p.copy_(b)
    return SignRoundResult(first, best_loss, last, best_step, settings.iters)
