"""Teacher-forced measures over a slice's texts: perplexity (rolling windows), per-token
KL, top-1 agreement, the same on focus tokens (digits, names, brackets), and KL by
position bucket. Baseline and candidate see identical token windows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .divergence import kl_by_position, position_buckets, token_stats
from .models import forward_logits
from .perplexity import perplexity, rolling_windows


@dataclass
class Encoded:
    item_id: str
    ids: list[int]
    focus: list[bool]          # per token: overlaps a focus span


def encode_text(tokenizer, item: dict, max_tokens: int) -> Encoded:
    """Tokens of a text item (cut to ``max_tokens``) and which of them are focus tokens."""
    text = item["text"]
    spans = item.get("focus") or []
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=bool(spans))
    ids = enc["input_ids"][:max_tokens]
    focus = [False] * len(ids)
    if spans:
        for i, (a, b) in enumerate(enc["offset_mapping"][:max_tokens]):
            focus[i] = b > a and any(a < e and s < b for s, e in spans)
    return Encoded(str(item["id"]), ids, focus)


@dataclass
class ItemStats:
    item_id: str
    tokens: int = 0
    nll_base: float = 0.0
    nll_cand: float = 0.0
    kl_sum: float = 0.0
    top1: int = 0
    focus_tokens: int = 0
    focus_kl_sum: float = 0.0
    focus_top1: int = 0
    worst_kl: float = 0.0
    worst_pos: int = -1         # token index in the item where KL is largest


@dataclass
class ForcedResult:
    items: list[ItemStats]
    buckets: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        n = sum(s.tokens for s in self.items)
        fn = sum(s.focus_tokens for s in self.items)
        nb, nc = sum(s.nll_base for s in self.items), sum(s.nll_cand for s in self.items)
        out = {"tokens": n, "ppl_base": perplexity(nb, n), "ppl_cand": perplexity(nc, n),
               "kl_mean": sum(s.kl_sum for s in self.items) / n if n else None,
               "top1_agreement": sum(s.top1 for s in self.items) / n if n else None}
        out["ppl_increase"] = out["ppl_cand"] / out["ppl_base"] - 1.0 if n else None
        if fn:
            out["focus_tokens"] = fn
            out["focus_kl_mean"] = sum(s.focus_kl_sum for s in self.items) / fn
            out["focus_top1_agreement"] = sum(s.focus_top1 for s in self.items) / fn
        filled = [b for b in self.buckets if b["tokens"]]
        if filled:
            out["kl_worst_bucket"] = max(b["kl_mean"] for b in filled)
        return out


def _jobs(encoded: list[Encoded], max_len: int):
    for k, e in enumerate(encoded):
        for w in rolling_windows(len(e.ids), max_len):
            yield k, w


def run_forced(base, cand, encoded: list[Encoded], max_len: int, pad: int, batch_tokens: int,
               bucket_positions: bool = False, progress=None) -> ForcedResult:
    """Score every token of every text once, with both models, batching windows by length."""
    stats = [ItemStats(e.item_id) for e in encoded]
    jobs = sorted(_jobs(encoded, max_len), key=lambda j: j[1].end - j[1].start)
    kls, poss = [], []
    i = 0
    while i < len(jobs):
        width = jobs[i][1].end - jobs[i][1].start
        n = max(1, batch_tokens // max(width, 1))
        batch = jobs[i:i + n]
        width = max(w.end - w.start for _, w in batch)
        while len(batch) > 1 and len(batch) * width > batch_tokens:
            batch = batch[:-1]
        i += len(batch)
        seqs = [encoded[k].ids[w.start:w.end] for k, w in batch]
        lb = forward_logits(base, seqs, pad)
        lc = forward_logits(cand, seqs, pad)
        for row, (k, w) in enumerate(batch):
            e, st = encoded[k], stats[k]
            L = w.end - w.start
            p0 = w.score_from
            targets = torch.tensor(e.ids[w.start + 1 + p0:w.end])
            if targets.numel() == 0:
                continue
            s = token_stats(lb[row, p0:L - 1], lc[row, p0:L - 1], targets)
            focus = torch.tensor(e.focus[w.start + 1 + p0:w.end], dtype=torch.bool)
            st.tokens += targets.numel()
            st.nll_base += float(s["nll_base"].sum())
            st.nll_cand += float(s["nll_cand"].sum())
            st.kl_sum += float(s["kl"].sum())
            st.top1 += int(s["top1"].sum())
            st.focus_tokens += int(focus.sum())
            st.focus_kl_sum += float(s["kl"][focus].sum())
            st.focus_top1 += int(s["top1"][focus].sum())
            j = int(s["kl"].argmax())
            if float(s["kl"][j]) > st.worst_kl:
                st.worst_kl, st.worst_pos = float(s["kl"][j]), w.start + 1 + p0 + j
            if bucket_positions:
                kls.append(s["kl"])
                # context length seen when predicting each target
                poss.append(torch.arange(p0 + 1, L))
        if progress is not None:
            progress(len(batch))
    result = ForcedResult(stats)
    if bucket_positions and kls:
        result.buckets = kl_by_position(torch.cat(kls), torch.cat(poss), position_buckets(max_len))
    return result
