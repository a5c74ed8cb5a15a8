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

# Limits set on the second synthetic log (benchmarks/calibration_fidelity.py label_log, 400 rows,
# seed 1; benchmarks/business_evidence.py labels), SmolLM2-135M-Instruct, the classification
# slice's first 64 rows (56 whose baseline reply gives a label); checked on seed 3 (other rows:
# tests/evaluation/test_label_measures.py): W8A16 RTN within both, the planted fault past
# label_agreement's. One row is 0.018 of the agreement.
AGREEMENT = ("W8A16 RTN 0.946, W4A16 g64 RTN 0.679, planted label fault (8 final-norm channels x3) 0.625: "
             "REVIEW at 3.7x W8's disagreement (0.054), NO-GO above W4 RTN's")
PROB_DROP = ("W8A16 RTN 0.0048, planted label fault 0.020, W4A16 g64 RTN 0.128 (baseline 0.433): "
             "REVIEW 10x W8's, NO-GO under W4 RTN's")


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


@measure(name="label_agreement", higher_is_better=True, review=0.80, nogo=0.70, applies=_has_labelled,
         evidence=AGREEMENT, title="label agreement", table=("label_rows", "label_agreement"),
         table_rank=11, meaning="the candidate answers with another label than the baseline")
def label_agreement(s: ScoredSlice) -> float:
    """Of the rows whose baseline reply gives a label, the share where the candidate's gives the same."""
    rows = labelled(s)
    return sum(s.labels.base_labels[k] == s.labels.cand_labels[k] for k in rows) / len(rows)


@measure(name="label_prob_drop", higher_is_better=False, review=0.05, nogo=0.10, applies=_has_labels,
         evidence=PROB_DROP, title="label prob drop",
         table=("label_prob_base", "label_prob_cand", "label_prob_drop"), table_rank=12,
         meaning="the candidate is less sure of the baseline's label")
def label_prob_drop(s: ScoredSlice) -> float:
    """The baseline's mean probability of its own greedy reply's tokens minus the candidate's."""
    pb, pc = label_probabilities(s)
    return pb - pc
