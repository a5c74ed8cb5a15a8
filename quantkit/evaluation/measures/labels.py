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

AGREEMENT = "to be measured"
PROB_DROP = "to be measured"


def _has_labels(s: ScoredSlice) -> bool:
    return s.labels is not None and bool(s.labels.replies)


def labelled(s: ScoredSlice) -> list[int]:
    """The rows whose baseline reply gives one of the task's labels: where it says something else
    (a small model's free text), a reply that forks on a near-tie is not a label changed."""
    return [k for k, x in enumerate(s.labels.base_labels) if x in s.labels.labels]


def _has_labelled(s: ScoredSlice) -> bool:
    return _has_labels(s) and bool(labelled(s))


def label_probabilities(s: ScoredSlice) -> tuple[float, float]:
    """The baseline's and the candidate's mean probability of the baseline's reply tokens (per row
    the geometric mean over the reply and its end token, then the mean over rows)."""
    items = s.labels.forced.items
    pb = sum(math.exp(-r.nll_base / r.tokens) for r in items) / len(items)
    pc = sum(math.exp(-r.nll_cand / r.tokens) for r in items) / len(items)
    return pb, pc


@measure(name="label_agreement", higher_is_better=True, review=0.80, nogo=0.65, applies=_has_labelled,
         evidence=AGREEMENT, title="label agreement", table=("label_rows", "label_agreement"),
         table_rank=11, meaning="the candidate answers with another label than the baseline")
def label_agreement(s: ScoredSlice) -> float:
    """Of the rows whose baseline reply gives a label, the share where the candidate's gives the same."""
    rows = labelled(s)
    return sum(s.labels.base_labels[k] == s.labels.cand_labels[k] for k in rows) / len(rows)


@measure(name="label_prob_drop", higher_is_better=False, review=0.05, nogo=0.15, applies=_has_labels,
         evidence=PROB_DROP, title="label prob drop",
         table=("label_prob_base", "label_prob_cand", "label_prob_drop"), table_rank=12,
         meaning="the candidate is less sure of the baseline's label")
def label_prob_drop(s: ScoredSlice) -> float:
    """The baseline's mean probability of its own greedy reply's tokens minus the candidate's."""
    pb, pc = label_probabilities(s)
    return pb - pc
