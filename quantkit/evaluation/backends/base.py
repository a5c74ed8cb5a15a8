"""The scoring-backend contract: what the measures need from a scored slice, and the calls a
backend answers to produce it.

A backend runs the baseline and the candidate on the same inputs and returns, per slice, a
``ScoredSlice``; the measures (``measures/``) read only that. The in-process backend
(in_process.py) runs both models in this process on packed tensors. Another backend (a
serving engine) implements the same five calls; where it cannot give a part (views of the
candidate, say) it raises rather than returning less.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

if TYPE_CHECKING:
    from quantkit.evaluation.forced import Encoded, ForcedRequest, ForcedResult, View


@dataclass(frozen=True)
class Continuation:
    """Both models' greedy continuations of one prompt, ``n_tokens`` asked for (fewer after EOS)."""
    prompt: list[int]
    base: list[int]
    cand: list[int]
    n_tokens: int


@dataclass(frozen=True)
class LabelRuns:
    """A label slice's rows (label_tasks.py): both models' greedy replies, the teacher-forced pass
    over the baseline's reply (per row, both models' NLL of it), and the label each reply gives."""
    replies: list[Continuation]
    forced: ForcedResult
    base_labels: list[str]
    cand_labels: list[str]
    labels: tuple[str, ...] = ()     # the task's label set


@dataclass(frozen=True)
class PairedRuns:
    """A task run on both models: one result per item and model, in the items' order."""
    items: list[dict]
    base: list
    cand: list

    def means(self, key: str) -> tuple[float, float]:
        """The baseline's and the candidate's mean of ``key`` over the items."""
        fb, fc = (sum(r[key] for r in rs) / len(rs) for rs in (self.base, self.cand))
        return fb, fc


@dataclass
class ScoredSlice:
    """What a backend returned for one slice; a part is None (or empty) when the slice has no
    items of its kind or it was not run.

    ``forced``: the teacher-forced texts, per row the sums over its scored tokens of both
    models' NLL, KL(baseline || candidate), top-1 agreement (and the same on focus tokens),
    with KL by position bucket on the long slices. ``generations``: greedy continuations.
    ``choices``: the choice each model picks (multiple choice). ``extraction``: each model's
    reply and its F1 against the reference numbers. ``code``: each model's completion and
    whether it passed its tests. ``labels``: a label slice's replies (label_tasks.py)."""
    forced: ForcedResult | None = None
    generations: list[Continuation] = field(default_factory=list)
    choices: PairedRuns | None = None
    extraction: PairedRuns | None = None
    code: PairedRuns | None = None
    labels: LabelRuns | None = None


@dataclass(frozen=True)
class CodeRequest:
    """How code items are completed and run: tokens per completion, batch, per-program timeout,
    and the runner (the sandbox) the programs run behind."""
    n_tokens: int
    batch: int
    timeout_s: float
    runner: object


class ScoringBackend(Protocol):
    """Scores the baseline and the candidate on the same inputs."""

    def teacher_forced(self, encoded: list[Encoded], request: ForcedRequest,
                       views: Mapping[str, View] | None = None) -> ForcedResult:
        """Every scored token of every text, predicted by both models from identical windows."""

    def continuations(self, prompts: list[list[int]], n_tokens: int, batch: int) -> list[Continuation]:
        """Both models' greedy continuations of each prompt."""

    def multiple_choice(self, items: list[dict]) -> PairedRuns:
        """The choice index each model gives each question."""

    def extraction(self, items: list[dict], n_tokens: int, batch: int) -> PairedRuns:
        """Each model's greedy reply per item, with its F1 against the item's reference numbers."""

    def code(self, items: list[dict], request: CodeRequest) -> PairedRuns:
        """Each model's completion per problem, run against the problem's tests."""
