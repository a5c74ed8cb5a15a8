"""Teacher-forced measures over a slice's texts: perplexity (rolling windows), per-token
KL, top-1 agreement, the same on focus tokens (digits, names, brackets), and KL by
position bucket. Baseline and candidate see identical token windows.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from torch import nn

from quantkit.evaluation.divergence import bucket_measures, kl_by_position, position_buckets, token_stats
from quantkit.evaluation.causal_lm import body_states, head_logits, position_chunks
from quantkit.evaluation.pair import both, pair
from quantkit.evaluation.perplexity import perplexity, rolling_windows

# Logit tokens (batch rows x positions) per head call: 1 GiB a model at Gemma3's vocabulary, float32
LOGIT_CHUNK_TOKENS = 1024
View = Callable[[nn.Module], AbstractContextManager]


@dataclass
class Encoded:
    item_id: str
    ids: list[int]
    focus: list[bool]          # per token: overlaps a focus span
    scored: list[bool] | None = None   # per token: predicted and measured (None: every token)


def encode_text(tokenizer, item: dict, max_tokens: int) -> Encoded:
    """Tokens of a text item (cut to ``max_tokens``), which of them are focus tokens and, when the
    item names ``score`` spans (a chat row's assistant turns), which are scored. An item whose
    scored tokens lie past ``max_tokens`` keeps the window that ends at its last scored token."""
    text = item["text"]
    spans, score = item.get("focus") or [], item.get("score")
    enc = tokenizer(text, add_special_tokens=not _has_bos(tokenizer, text), return_offsets_mapping=bool(spans or score))
    ids = enc["input_ids"]
    offsets = enc["offset_mapping"] if spans or score else None
    scored = _overlaps(offsets, score) if score else None
    start = 0
    if len(ids) > max_tokens and scored is not None and any(scored):
        end = max(max_tokens, max(i for i, x in enumerate(scored) if x) + 1)
        start = end - max_tokens
    ids = ids[start:start + max_tokens]
    focus = _overlaps(offsets, spans)[start:start + max_tokens] if spans else [False] * len(ids)
    return Encoded(str(item["id"]), ids, focus, None if scored is None else scored[start:start + max_tokens])


def _has_bos(tokenizer, text: str) -> bool:
    """A chat template that writes the BOS itself (Llama 3's ``<|begin_of_text|>``) must not get two."""
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and text.startswith(bos)


def _overlaps(offsets, spans) -> list[bool]:
    """Per token: its characters overlap one of ``spans`` ([start, end) character ranges)."""
    return [b > a and any(a < e and s < b for s, e in spans) for a, b in offsets]


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
    # variants of the candidate (views, e.g. KV-cache options): name -> kl_mean, top1_agreement,
    # tokens and (with bucket_positions) buckets, on the same windows
    views: dict[str, dict] = field(default_factory=dict)
    deepest: int = 0            # the longest context any scored token was predicted from
    # served backend: the candidate's figures in the engine beside the same checkpoint in this
    # process, on the same windows (backends/served_forced.py PathCheck.figures)
    path: dict | None = None

    def figures(self) -> dict:
        """What the slice table shows beside the measures: tokens scored, both perplexities,
        focus tokens, and the first and deepest position buckets."""
        n = sum(s.tokens for s in self.items)
        fn = sum(s.focus_tokens for s in self.items)
        nb, nc = sum(s.nll_base for s in self.items), sum(s.nll_cand for s in self.items)
        out = {"tokens": n, "ppl_base": perplexity(nb, n), "ppl_cand": perplexity(nc, n)}
        if fn:
            out["focus_tokens"] = fn
        buckets = bucket_measures(self.buckets)
        out.update({k: buckets[k] for k in ("kl_first_bucket", "last_bucket_start", "last_bucket_end")
                    if k in buckets})
        if self.path and self.path["tokens"]:   # served: the tokens the path agreement compared
            p = self.path
            out.update(path_tokens=p["tokens"], path_ppl_engine=perplexity(p["nll_engine"], p["tokens"]),
                       path_ppl_own=perplexity(p["nll_in_process"], p["tokens"]), path_top1=p["top1_same"] / p["tokens"])
        return out


@dataclass(frozen=True)
class ForcedRequest:
    """How texts are scored: windows of ``max_len`` tokens (rolling past it), in batches of
    at most ``batch_tokens`` padded tokens, each model's head over ``chunk_tokens`` positions
    at a time; ``bucket_positions``: KL by position bucket too."""
    max_len: int
    batch_tokens: int
    bucket_positions: bool = False
    chunk_tokens: int = LOGIT_CHUNK_TOKENS


def forced_jobs(encoded: list[Encoded], max_len: int):
    for k, e in enumerate(encoded):
        for w in rolling_windows(len(e.ids), max_len):
            yield k, w


def _batches(jobs: list, batch_tokens: int):
    """Windows sorted by length, grouped so a batch's padded tokens stay within ``batch_tokens``."""
    jobs = sorted(jobs, key=lambda j: j[1].end - j[1].start)
    i = 0
    while i < len(jobs):
        width = jobs[i][1].end - jobs[i][1].start
        batch = jobs[i:i + max(1, batch_tokens // max(width, 1))]
        width = max(w.end - w.start for _, w in batch)
        while len(batch) > 1 and len(batch) * width > batch_tokens:
            batch = batch[:-1]
        i += len(batch)
        yield batch


class Tally:
    """Per-position KL, top-1 agreement and positions of one variant of the candidate."""

    def __init__(self) -> None:
        self.kl, self.top1, self.pos = [], [], []

    def add(self, s: dict, positions: torch.Tensor) -> None:
        self.kl.append(s["kl"])
        self.top1.append(s["top1"])
        self.pos.append(positions)

    def result(self, edges: list[int] | None) -> dict:
        kl, top1 = torch.cat(self.kl), torch.cat(self.top1)
        out = {"tokens": int(kl.numel()), "kl_mean": float(kl.mean()), "top1_agreement": float(top1.float().mean())}
        if edges is not None:
            out["buckets"] = kl_by_position(kl, torch.cat(self.pos), edges)
            out.update(bucket_measures(out["buckets"]))
        return out


def run_forced(base, cand, encoded: list[Encoded], request: ForcedRequest, pad: int,
               views: Mapping[str, View] | None = None) -> ForcedResult:
    """Score every token of every text once, with both models, batching windows by length.

    Each model's body runs once per batch and its head over ``request.chunk_tokens`` positions
    at a time. ``views`` (name -> a context manager factory, ``with view(cand) as model:``) are
    variants of the candidate scored on the same windows against the same baseline logits
    (KL, top-1 agreement and, with ``bucket_positions``, KL by position)."""
    views = dict(views or {})
    stats = [ItemStats(e.item_id) for e in encoded]
    main, tallies = Tally(), {name: Tally() for name in views}
    for batch in _batches(list(forced_jobs(encoded, request.max_len)), request.batch_tokens):
        seqs = [encoded[k].ids[w.start:w.end] for k, w in batch]
        width = max(len(q) for q in seqs)
        hb, hc = both(lambda m: body_states(m, seqs, pad), base, cand)
        hv = {}
        for name, view in views.items():
            with view(cand) as model:
                hv[name] = body_states(model, seqs, pad)
        for s0, s1 in position_chunks(width, len(batch), request.chunk_tokens):
            lb, lc = pair(lambda: head_logits(base, hb[:, s0:s1]), lambda: head_logits(cand, hc[:, s0:s1]), base, cand)
            for row, k, w, p0, p1 in _scored(batch, s0, s1):
                e = encoded[k]
                a, b = w.start + 1 + p0, w.start + 1 + p1   # the tokens these positions predict
                keep = scored_mask(e, a, b)
                s = kept(token_stats(lb[row, p0 - s0:p1 - s0], lc[row, p0 - s0:p1 - s0],
                                      torch.tensor(e.ids[a:b])), keep)
                if s["kl"].numel():
                    add_item(stats[k], s, kept(torch.tensor(e.focus[a:b], dtype=torch.bool), keep),
                              kept(torch.arange(a, b), keep))
                    main.add(s, kept(torch.arange(p0 + 1, p1 + 1), keep))
            del lc   # one variant's logits at a time: 1 GiB a chunk at Gemma3's vocabulary
            for name, view in views.items():
                with view(cand) as model:
                    lv = head_logits(model, hv[name][:, s0:s1])
                _tally_view(tallies[name], lb, lv, encoded, _scored(batch, s0, s1), s0)
                del lv
    return forced_result(stats, main, tallies, request)


def _tally_view(tally: Tally, lb: torch.Tensor, lv: torch.Tensor, encoded: list[Encoded], scored, s0: int) -> None:
    """Add one chunk of a view's logits, against the baseline's, to its tally."""
    for row, k, w, p0, p1 in scored:
        a, b = w.start + 1 + p0, w.start + 1 + p1
        keep = scored_mask(encoded[k], a, b)
        s = kept(token_stats(lb[row, p0 - s0:p1 - s0], lv[row, p0 - s0:p1 - s0],
                              torch.tensor(encoded[k].ids[a:b])), keep)
        if s["kl"].numel():
            tally.add(s, kept(torch.arange(p0 + 1, p1 + 1), keep))


def forced_result(stats: list[ItemStats], main: Tally, tallies: dict[str, Tally], request: ForcedRequest) -> ForcedResult:
    result = ForcedResult(stats)
    if main.kl:
        edges = position_buckets(request.max_len) if request.bucket_positions else None
        if edges is not None:
            result.buckets = main.result(edges)["buckets"]
        result.views = {name: t.result(edges) for name, t in tallies.items() if t.kl}
        result.deepest = int(max(int(p.max()) for p in main.pos))
    return result


def _scored(batch: list, s0: int, s1: int):
    """(row, item, window, p0, p1) for each window of ``batch`` with scored positions in chunk
    ``[s0, s1)``: window position p predicts token ``w.start + p + 1``; the window scores p in
    ``[score_from, L - 1)``, the chunk holds ``[s0, s1)``. The context length each target is
    predicted from is ``p + 1``."""
    for row, (k, w) in enumerate(batch):
        p0, p1 = max(w.score_from, s0), min(w.end - w.start - 1, s1)
        if p1 > p0:
            yield row, k, w, p0, p1


def scored_mask(e: Encoded, a: int, b: int) -> torch.Tensor | None:
    """Which of tokens ``[a, b)`` of ``e`` are scored (None: all of them)."""
    return None if e.scored is None else torch.tensor(e.scored[a:b], dtype=torch.bool)


def kept(x, keep: torch.Tensor | None):
    """``x`` (a tensor, or a dict of per-token tensors) at the scored tokens only."""
    if keep is None:
        return x
    return {k: v[keep] for k, v in x.items()} if isinstance(x, dict) else x[keep]


def add_item(st: ItemStats, s: dict, focus: torch.Tensor, index: torch.Tensor) -> None:
    """Add one run of scored tokens (their token indices in the item: ``index``) to an item."""
    st.tokens += s["kl"].numel()
    st.nll_base += float(s["nll_base"].sum())
    st.nll_cand += float(s["nll_cand"].sum())
    st.kl_sum += float(s["kl"].sum())
    st.top1 += int(s["top1"].sum())
    st.focus_tokens += int(focus.sum())
    st.focus_kl_sum += float(s["kl"][focus].sum())
    st.focus_top1 += int(s["top1"][focus].sum())
    j = int(s["kl"].argmax())
    if float(s["kl"][j]) > st.worst_kl:
        st.worst_kl, st.worst_pos = float(s["kl"][j]), int(index[j])
