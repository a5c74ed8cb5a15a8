"""Label measures, on business slices whose replies are a label (labels.py): does the candidate
give the baseline's label, and how much of the baseline's confidence in it does it keep.

Both are read from the rows' own prompts: each model's greedy reply (at most ``LABEL_GEN_TOKENS``
tokens, the end of turn included) and the label found in it (``labels.read_label``: a small model
says "The review is positive."), then the baseline's reply teacher-forced through both models.
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
    """Share of rows whose greedy reply gives the baseline's label (the same reply, where neither
    holds one of the task's labels)."""
    got = s.labels
    return sum(a == b for a, b in zip(got.base_labels, got.cand_labels)) / len(got.base_labels)


@measure(name="label_prob_drop", higher_is_better=False, review=0.05, nogo=0.15, applies=_has_labels,
         evidence="to be measured", title="label prob drop",
         table=("label_prob_base", "label_prob_cand", "label_prob_drop"), table_rank=12,
         meaning="the candidate is less sure of the baseline's label")
def label_prob_drop(s: ScoredSlice) -> float:
    """The baseline's mean probability of its own greedy reply minus the candidate's."""
    pb, pc = label_probabilities(s)
    return pb - pc
