"""Label measures, on business slices whose replies are a label (labels.py): does the candidate
give the baseline's label, and how much of the baseline's confidence in it does it keep.

Both are read from the rows' own prompts: each model's greedy reply (at most ``LABEL_GEN_TOKENS``
tokens, the end of turn included), then the baseline's reply teacher-forced through both models.
"""
from __future__ import annotations

import math

from quantkit.evaluation.backends.base import ScoredSlice
from quantkit.evaluation.measures.base import measure


def _has_labels(s: ScoredSlice) -> bool:
    return s.labels is not None and bool(s.labels.replies)


def label_probabilities(s: ScoredSlice) -> tuple[float, float]:
    """The baseline's and the candidate's mean probability of the baseline's reply (the product
    over its tokens, end of turn included), over the rows."""
    items = s.labels.forced.items
    pb = sum(math.exp(-r.nll_base) for r in items) / len(items)
    pc = sum(math.exp(-r.nll_cand) for r in items) / len(items)
    return pb, pc


@measure(name="label_agreement", higher_is_better=True, review=0.95, nogo=0.85, applies=_has_labels,
         evidence="to be measured", title="label agreement", table=("label_rows", "label_agreement"),
         table_rank=11, meaning="the candidate answers with another label than the baseline")
def label_agreement(s: ScoredSlice) -> float:
    """Share of rows whose greedy reply is the baseline's, token for token."""
    replies = s.labels.replies
    return sum(c.base == c.cand for c in replies) / len(replies)


@measure(name="label_prob_drop", higher_is_better=False, review=0.05, nogo=0.15, applies=_has_labels,
         evidence="to be measured", title="label prob drop",
         table=("label_prob_base", "label_prob_cand", "label_prob_drop"), table_rank=12,
         meaning="the candidate is less sure of the baseline's label")
def label_prob_drop(s: ScoredSlice) -> float:
    """The baseline's mean probability of its own greedy reply minus the candidate's."""
    pb, pc = label_probabilities(s)
    return pb - pc
