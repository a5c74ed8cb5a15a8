"""Label tasks: a business task whose replies are a label from a small set (a sentiment, a
category, yes/no). Its teacher-forced KL rests on one or two tokens a row, and what the service
returns is the label itself: such a slice is also judged on whether the candidate gives the
baseline's label (measures/labels.py).

The rule, over the task's rows with a reply in the log: its ``LABEL_MAX_DISTINCT`` most common
replies (stripped) of at most ``LABEL_MAX_TOKENS`` tokens cover at least ``LABEL_MIN_COVERAGE``
of those rows, and the task has at least ``LABEL_MIN_ROWS`` such rows (fewer rows show no set,
only the replies they happen to hold).

>>> label_set(["positive"] * 20 + ["negative"] * 19 + ["neutral"], lambda s: 1)
('positive', 'negative', 'neutral')
>>> label_set(["positive"] * 20 + [f"a long answer {i}" for i in range(20)], lambda s: 1)
()
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Callable

from quantkit.evaluation.backends.base import Continuation, LabelRuns, ScoringBackend

if TYPE_CHECKING:
    from quantkit.evaluation.forced import Encoded, ForcedRequest

LABEL_MAX_TOKENS = 4          # "正面" is 4 byte tokens in SmolLM2's vocabulary, "positive" one
LABEL_MAX_DISTINCT = 16
LABEL_MIN_COVERAGE = 0.9
LABEL_MIN_ROWS = 32
# a label, its end of turn, and room for a short lead-in ("The review is positive."): small
# models answer so, whatever the instruction says
LABEL_GEN_TOKENS = 8
# rows of a label slice replied to (its first scored rows): each costs both models its prompt
# twice (the greedy reply, then the baseline's reply teacher-forced); one row is 1.6% of the
# agreement, against the 1024 scored tokens' 200-500 rows
LABEL_ROWS = 64


def label_set(replies: list[str | None], n_tokens: Callable[[str], int]) -> tuple[str, ...]:
    """The task's labels, most common first, when its logged ``replies`` (None: a row without
    one) follow the rule above; else ``()``. ``n_tokens`` counts a reply's tokens."""
    given = [r.strip() for r in replies if r is not None and r.strip()]
    counts = Counter(given).most_common()
    need = LABEL_MIN_COVERAGE * len(given)
    if len(given) < LABEL_MIN_ROWS or sum(n for _, n in counts[:LABEL_MAX_DISTINCT]) < need:
        return ()          # decided without counting a token: most tasks' replies are all distinct
    short = []
    for reply, n in counts:
        if n_tokens(reply) <= LABEL_MAX_TOKENS:
            short.append((reply, n))
            if len(short) == LABEL_MAX_DISTINCT:
                break
    return tuple(r for r, _ in short) if sum(n for _, n in short) >= need else ()


def read_label(reply: str, labels: tuple[str, ...]) -> str:
    """The label a reply gives: the label found first in it (case aside; the longer of two found
    at the same place), else the reply itself, stripped.

    >>> read_label("The review is Positive.", ("positive", "negative")), read_label("Maybe so", ("yes", "no"))
    ('positive', 'maybe so')
    """
    text = reply.lower()
    found = [(text.find(x.lower()), -len(x), x) for x in labels if x.lower() in text]
    return min(found)[2] if found else text.strip()


def reply_encoded(c: Continuation, eos: int | None, k: int) -> Encoded:
    """The prompt with the baseline's greedy reply (and the end token, where it stopped there),
    only the reply's tokens scored."""
    from quantkit.evaluation.forced import Encoded   # here: business.py reads the rule without torch

    reply = list(c.base) + ([eos] if eos is not None and len(c.base) < c.n_tokens else [])
    ids = list(c.prompt) + reply
    return Encoded(f"label-{k}", ids, [False] * len(ids), [False] * len(c.prompt) + [True] * len(reply))


def label_runs(backend: ScoringBackend, prompts: list[list[int]], decode: Callable[[list[int]], str],
               labels: tuple[str, ...], eos: int | None, request: ForcedRequest, batch: int) -> LabelRuns:
    """Both models' greedy replies to ``prompts`` and the label found in each (``decode`` gives a
    reply's text), then both models' NLL of the baseline's reply."""
    replies = backend.continuations(prompts, LABEL_GEN_TOKENS, batch)
    forced = backend.teacher_forced([reply_encoded(c, eos, k) for k, c in enumerate(replies)], request)
    return LabelRuns(replies, forced, [read_label(decode(c.base), labels) for c in replies],
                     [read_label(decode(c.cand), labels) for c in replies], labels)
