"""Per-token divergence between a baseline and a candidate on the same inputs.

Pure functions over logits. KL is KL(baseline || candidate) in nats: how much probability
mass the candidate moves away from what the baseline predicts, token by token.
"""
from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 512  # positions per log-softmax: bounds the [chunk, vocab] temporaries


def token_stats(base_logits: Tensor, cand_logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
    """Per position: baseline/candidate NLL of ``targets``, KL, top-1 agreement.

    ``base_logits`` and ``cand_logits`` are ``[T, V]`` (row t predicts ``targets[t]``).

    >>> x = torch.randn(5, 7); s = token_stats(x, x, torch.zeros(5, dtype=torch.long))
    >>> float(s["kl"].abs().max()) < 1e-6 and bool(s["top1"].all())
    True
    """
    if base_logits.shape != cand_logits.shape:
        raise ValueError(f"logit shapes differ: {tuple(base_logits.shape)} vs {tuple(cand_logits.shape)}")
    out = {k: [] for k in ("nll_base", "nll_cand", "kl", "top1")}
    for s in range(0, base_logits.shape[0], CHUNK):
        lb = torch.log_softmax(base_logits[s:s + CHUNK].float(), dim=-1)
        lc = torch.log_softmax(cand_logits[s:s + CHUNK].float(), dim=-1)
        t = targets[s:s + CHUNK].unsqueeze(-1)
        out["nll_base"].append(-lb.gather(-1, t).squeeze(-1))
        out["nll_cand"].append(-lc.gather(-1, t).squeeze(-1))
        # clamp: rounding can make a tiny KL negative
        out["kl"].append((lb.exp() * (lb - lc)).sum(-1).clamp_min(0.0))
        out["top1"].append(lb.argmax(-1) == lc.argmax(-1))
    return {k: torch.cat(v) for k, v in out.items()}


def position_buckets(max_len: int) -> list[int]:
    """Bucket edges over [0, max_len): powers of two from 128 up, so long-range drift shows."""
    edges, e = [0], 128
    while e < max_len:
        edges.append(e)
        e *= 2
    edges.append(max_len)
    return edges


def kl_by_position(kl: Tensor, positions: Tensor, edges: list[int]) -> list[dict]:
    """Mean KL and top-1 count per position bucket ``[edges[i], edges[i+1])``."""
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (positions >= lo) & (positions < hi)
        n = int(m.sum())
        rows.append({"start": lo, "end": hi, "tokens": n,
                     "kl_mean": float(kl[m].mean()) if n else None})
    return rows


def bucket_measures(rows: list[dict]) -> dict[str, float]:
    """The verdict's view of KL by position: the worst bucket, and the deepest bucket that holds
    tokens (where KV-cache error has had the whole context to accumulate), with its range.

    >>> rows = kl_by_position(torch.tensor([0.1, 0.3, 0.2]), torch.tensor([5, 130, 300]), [0, 128, 256, 512, 1024])
    >>> bucket_measures(rows)
    {'kl_worst_bucket': 0.30000001192092896, 'kl_first_bucket': 0.10000000149011612, 'kl_last_bucket': 0.20000000298023224, 'last_bucket_start': 256, 'last_bucket_end': 512}
    """
    filled = [b for b in rows if b["tokens"]]
    if not filled:
        return {}
    return {"kl_worst_bucket": max(b["kl_mean"] for b in filled), "kl_first_bucket": filled[0]["kl_mean"],
            "kl_last_bucket": filled[-1]["kl_mean"], "last_bucket_start": filled[-1]["start"],
            "last_bucket_end": filled[-1]["end"]}
