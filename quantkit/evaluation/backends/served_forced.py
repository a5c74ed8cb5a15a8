"""The teacher-forced pass from what a server returned for both models, and the path agreement:
the candidate's engine predictions beside the same checkpoint's in this process.

Positions map as in forced.py: window position p predicts token ``w.start + p + 1``, which the
server reports at prompt index ``p + 1`` (index j holds the log-probability of token j given the
tokens before it)."""
from __future__ import annotations

import threading

import torch

from quantkit.evaluation.forced import (LOGIT_CHUNK_TOKENS, Encoded, ForcedRequest, ForcedResult, ItemStats, Tally,
                                        add_item, forced_result, kept, scored_mask)
from quantkit.evaluation.causal_lm import body_states, head_logits, position_chunks
from quantkit.evaluation.topk import topk_of_logits, topk_token_stats
from quantkit.evaluation.backends.window_scores import WindowScores


def served_forced(encoded: list[Encoded], request: ForcedRequest, jobs: list, base: list[WindowScores],
                  cand: list[WindowScores], path: dict | None = None) -> ForcedResult:
    """Per item and, with ``request.bucket_positions``, per position bucket: the figures
    ``run_forced`` gives, from both models' served predictions over the windows ``jobs``."""
    stats = [ItemStats(e.item_id) for e in encoded]
    main = Tally()
    for (k, w), sb, sc in zip(jobs, base, cand):
        e = encoded[k]
        p0, p1 = w.score_from, w.end - w.start - 1
        if p1 <= p0:
            continue
        a, b = w.start + 1 + p0, w.start + 1 + p1
        keep = scored_mask(e, a, b)
        s = kept(topk_token_stats(sb.topk(p0 + 1, p1 + 1), sc.topk(p0 + 1, p1 + 1), e.ids[a:b]), keep)
        if s["kl"].numel():
            add_item(stats[k], s, kept(torch.tensor(e.focus[a:b], dtype=torch.bool), keep), kept(torch.arange(a, b), keep))
            main.add(s, kept(torch.arange(p0 + 1, p1 + 1), keep))
    result = forced_result(stats, main, {}, request)
    result.path = path
    return result


class PathCheck:
    """The candidate loaded in this process (``quantkit.load``), scoring the windows the engine
    scored, up to ``budget`` tokens a slice: its NLL and top-1 token beside the engine's."""

    def __init__(self, model, pad: int, budget: int = 4096) -> None:
        self.model, self.pad, self.budget = model, pad, budget
        # slices scored at once (served.SLICES_AT_ONCE) take turns: one forward in this process at a time
        self._turn = threading.Lock()

    def figures(self, encoded: list[Encoded], jobs: list, cand: list[WindowScores]) -> dict:
        """Tokens compared, both paths' summed NLL of the actual tokens, and how many tokens both
        rank first alike."""
        out = {"tokens": 0, "nll_engine": 0.0, "nll_in_process": 0.0, "top1_same": 0, "kl_sum": 0.0}
        with self._turn:
            for (k, w), sc in zip(jobs, cand):
                if out["tokens"] >= self.budget:
                    break
                seq = encoded[k].ids[w.start:w.end]
                p0, p1 = w.score_from, len(seq) - 1
                if p1 > p0:
                    self._window(encoded[k], w.start, seq, (p0, p1), sc, out)
        return out

    def _window(self, e: Encoded, start: int, seq: list[int], scored: tuple[int, int], sc: WindowScores,
                out: dict) -> None:
        p0, p1 = scored
        states = body_states(self.model, [seq], self.pad)
        for s0, s1 in position_chunks(len(seq), 1, LOGIT_CHUNK_TOKENS):
            lo, hi = max(s0, p0), min(s1, p1)
            if hi <= lo:
                continue
            logits = head_logits(self.model, states[:, lo:hi])[0].float()
            targets = torch.tensor(seq[lo + 1:hi + 1])
            # the in-process distribution cut to the engine's k, so KL(in-process || engine) is estimated as
            # the baseline-candidate KL is (topk.py), and the two are comparable
            own = topk_of_logits(logits, targets, sc.ids.shape[1] - 1)
            s = kept(topk_token_stats(own, sc.topk(lo + 1, hi + 1), targets.tolist()), scored_mask(e, start + 1 + lo,
                                                                                                start + 1 + hi))
            out["tokens"] += int(s["kl"].numel())
            out["nll_in_process"] += float(s["nll_base"].sum())
            out["nll_engine"] += float(s["nll_cand"].sum())
            out["top1_same"] += int(s["top1"].sum())
            out["kl_sum"] += float(s["kl"].sum())
