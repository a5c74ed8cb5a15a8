"""Per-token KL(baseline || candidate) estimated from what an OpenAI-compatible server returns.

A server scoring a prompt (vLLM's ``/v1/completions`` with ``echo`` and ``logprobs: k``) gives, at
each position, the log-probability of the actual next token and the k most likely tokens with
theirs (k <= 20 unless the server raises ``--max-logprobs``). ``divergence.token_stats`` needs both
models' full distributions; from a server only these lists are known, so the NLLs and top-1
agreement are read exactly and the KL is estimated.

The estimator, at one position, with p the baseline's and q the candidate's probabilities and t
the actual next token:

1. Support. S is the baseline's listed tokens plus t. Every p_i, i in S, is known exactly.
2. Candidate side. q_i is known exactly when the candidate listed i, and for i = t. Each other
   i in S (m of them: the baseline ranks them high, the candidate does not) gets the imputed
   q_i = min(q_min, U / m), q_min the smallest probability the candidate listed and U the mass
   the candidate left outside its list and t: an unlisted token is at most as likely as the
   least likely listed one, and the m of them share at most U.
3. Tail bucket. The tokens outside S are merged into one bucket, on both sides:
   p_rest = 1 - sum_S p_i, q_rest = 1 - sum_S q_i, each clamped to at least FLOOR.
4. The coarsened KL, a lower bound:
   L = sum_{i in S} p_i log(p_i / q_i) + p_rest log(p_rest / q_rest).
5. The tail term. Merging the tail loses p_rest * KL(p | rest || q | rest), the divergence
   inside it, which no list shows. To second order KL(p || q) = Var_p(d) / 2 with
   d_i = log p_i - log q_i; the tail's d is taken to spread as much as it does over B, the
   tokens both models listed, so T = p_rest * v / 2 with v the p-weighted variance of d over B,
   corrected for few weights (divided by 1 - sum_B w_i^2, w_i = p_i / sum_B p): a handful of
   tokens, one of them dominant, would otherwise understate it. T = 0 when B holds fewer than
   two tokens. The target counts in B only when both models listed it: a target the candidate
   all but rules out (d of 15 nats, measured) is exact in L, and as a variance sample it would
   say the whole tail moved that much.
6. KL_hat = max(L + T, 0).

Why L is a lower bound. Merging outcomes can only lose divergence (the data-processing
inequality): with exact q_i on S, L is the KL of the coarsened distributions, and the exact KL
exceeds it by the tail's divergence. An imputed q_i is not exact: it is at most q_min, which
bounds each unseen q_i from above, and U / m, the most their mean can be; measured, L exceeded
the exact KL by more than 1e-4 on 0.02% of the tokens at k = 5 and never at k = 20. When k
covers the vocabulary, S is every token, p_rest is 0 and KL_hat is the exact KL.

Measured on SmolLM2-135M (benchmarks/topk_kl.py, k = 20): L misses about a quarter of the KL;
T recovers most of it, and KL_hat still errs low (FP8 and int8 candidates: 7-9% on the mean, at
most 15% on a slice of every item; a 4-bit one, whose tail moves more than its head: 15%).

What no list shows: a position where the candidate's list departs from the baseline's. Its
top-20 sharing 0-2 tokens with the baseline's, the baseline's tokens are all imputed at about
q_min while their true q_i may be far smaller: measured, three such FP8 positions of exact KL
5-9 nats read under 1 and made a 4-item slice read 32% low. A slice's error is that of its
rare broken positions, not of its typical ones.

Robustness: a log-probability that is NaN is treated as not given (a listed token drops out of
its list; a NaN target leaves t out of S and gives a NaN NLL, as the server gave nothing to
measure). A -inf log-probability is a known zero probability, floored at FLOOR in the
logarithm, so one token costs a large but finite KL. Positive log-probabilities (rounding) are
read as 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from quantkit.evaluation.divergence import CHUNK

FLOOR = 1e-12   # smallest probability a bucket or a zero-probability token is given in a logarithm


@dataclass(frozen=True)
class TopK:
    """One model's prediction at one position as a server returns it."""

    target_logprob: float          # log-probability of the actual next token
    top: dict[int, float]          # the k most likely token ids -> log-probability


def topk_of_logits(logits: Tensor, targets: Tensor, k: int) -> list[TopK]:
    """What a server would return for ``logits`` ``[T, V]`` (row t predicts ``targets[t]``): per
    row the target's log-probability and the ``k`` most likely tokens (all of them when k >= V).

    >>> r = topk_of_logits(torch.tensor([[0.0, 0.0, 2.0]]), torch.tensor([1]), 1)[0]
    >>> list(r.top), round(r.top[2], 4), round(r.target_logprob, 4)
    ([2], -0.2395, -2.2395)
    """
    k = min(k, logits.shape[-1])
    out: list[TopK] = []
    for s in range(0, logits.shape[0], CHUNK):
        # the same float32 log-softmax as token_stats, so the NLLs read back equal its own
        lp = torch.log_softmax(logits[s:s + CHUNK].float(), dim=-1)
        vals, ids = lp.topk(k, dim=-1)
        tgt = lp.gather(-1, targets[s:s + CHUNK].unsqueeze(-1)).squeeze(-1)
        for t, v, i in zip(tgt.tolist(), vals.tolist(), ids.tolist()):
            out.append(TopK(t, dict(zip(i, v))))
    return out


def _listed(top: dict[int, float]) -> dict[int, float]:
    """Listed probabilities: NaN entries dropped, positive log-probabilities read as 0."""
    return {int(i): math.exp(min(v, 0.0)) for i, v in top.items() if not math.isnan(v)}


def _target(r: TopK, target: int, probs: dict[int, float]) -> dict[int, float]:
    """``probs`` with the target's exact probability added (it wins over a listed duplicate)."""
    if math.isnan(r.target_logprob):
        return probs
    return {**probs, target: math.exp(min(r.target_logprob, 0.0))}


def _kl_term(p: float, q: float) -> float:
    return p * math.log(p / max(q, FLOOR)) if p > 0.0 else 0.0


def _imputed(p: dict[int, float], q: dict[int, float], q_listed: dict[int, float]) -> dict[int, float]:
    """``q`` on every token of ``p``: the unseen ones at min(q_min, U / m) (step 2)."""
    unseen = [i for i in p if i not in q]
    if not unseen:
        return q
    q_min = min(q_listed.values(), default=1.0)
    left = max(1.0 - sum(q.values()), 0.0)
    return {**q, **dict.fromkeys(unseen, min(q_min, left / len(unseen)))}


def _tail_term(p: dict[int, float], q: dict[int, float], known: list[int], p_rest: float) -> float:
    """p_rest * v / 2, v the reliability-weighted variance of log p - log q over ``known`` (step 5)."""
    w = [p[i] for i in known if q[i] > 0.0]
    d = [math.log(p[i] / q[i]) for i in known if q[i] > 0.0]
    total = sum(w)
    if len(w) < 2 or total <= 0.0:
        return 0.0
    w = [x / total for x in w]
    mean = sum(a * b for a, b in zip(w, d))
    spread = 1.0 - sum(a * a for a in w)
    if spread <= 0.0:
        return 0.0
    return p_rest * sum(a * (b - mean) ** 2 for a, b in zip(w, d)) / spread / 2.0


def topk_kl(base: TopK, cand: TopK, target: int | None = None, tail: bool = True) -> float:
    """Estimated KL(baseline || candidate) in nats from both models' lists (module docstring).

    ``target``: the actual next token's id; without it the target is known only when listed.
    ``tail=False`` gives the coarsened KL alone (step 4), a lower bound of the exact KL when the
    candidate lists the baseline's tokens.

    >>> p = TopK(math.log(0.5), {0: math.log(0.5), 1: math.log(0.3)})
    >>> topk_kl(p, p, 0)
    0.0
    >>> q = TopK(math.log(0.5), {0: math.log(0.5), 2: math.log(0.3)})
    >>> round(topk_kl(p, q, 0), 4)   # q_1 = min(0.3, 0.2 / 1): 0.3 log(0.3/0.2) + 0.2 log(0.2/0.3)
    0.0405
    """
    p_listed, q_listed = _listed(base.top), _listed(cand.top)
    p = p_listed if target is None else _target(base, target, p_listed)
    q = q_listed if target is None else _target(cand, target, q_listed)
    both = [i for i in p if i in p_listed and i in q_listed]
    q = _imputed(p, q, q_listed)
    p_rest = max(1.0 - sum(p.values()), FLOOR)
    q_rest = max(1.0 - sum(q[i] for i in p), FLOOR)
    kl = sum(_kl_term(pi, q[i]) for i, pi in p.items()) + _kl_term(p_rest, q_rest)
    if tail:
        kl += _tail_term(p, q, both, p_rest)
    return max(kl, 0.0)


def _top1(r: TopK) -> int:
    """The listed token with the largest log-probability (the smallest id on a tie, as argmax)."""
    finite = {i: v for i, v in r.top.items() if not math.isnan(v)}
    if not finite:
        return -1
    best = max(finite.values())
    return min(i for i, v in finite.items() if v == best)


def topk_token_stats(base: list[TopK], cand: list[TopK], targets: list[int], tail: bool = True) -> dict[str, Tensor]:
    """``divergence.token_stats`` from server lists: the same keys and dtypes, NLLs and top-1
    agreement exact (read from the lists), KL estimated (``topk_kl``; ``tail=False``: its lower bound).

    >>> x = torch.randn(4, 9); t = torch.tensor([0, 3, 8, 1]); r = topk_of_logits(x, t, 9)
    >>> s = topk_token_stats(r, r, t.tolist()); float(s["kl"].max()), bool(s["top1"].all())
    (0.0, True)
    """
    if not len(base) == len(cand) == len(targets):
        raise ValueError(f"lengths differ: {len(base)} baseline, {len(cand)} candidate, {len(targets)} targets")
    return {
        "nll_base": torch.tensor([-r.target_logprob for r in base], dtype=torch.float32),
        "nll_cand": torch.tensor([-r.target_logprob for r in cand], dtype=torch.float32),
        "kl": torch.tensor([topk_kl(b, c, t, tail) for b, c, t in zip(base, cand, targets)], dtype=torch.float32),
        "top1": torch.tensor([_top1(b) == _top1(c) for b, c in zip(base, cand)], dtype=torch.bool),
    }
