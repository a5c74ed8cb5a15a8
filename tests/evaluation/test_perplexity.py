import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from quantkit.evaluation.forced import Encoded, ForcedRequest, run_forced
from quantkit.evaluation.measures import forced_summary
from quantkit.evaluation.perplexity import rolling_windows


@given(st.integers(2, 400), st.integers(2, 64), st.data())
def test_windows_score_every_target_exactly_once(n, max_len, data):
    stride = data.draw(st.integers(1, max_len))
    scored = []
    for w in rolling_windows(n, max_len, stride):
        assert w.end - w.start <= max_len and w.score_from >= 0
        scored += [w.start + p + 1 for p in range(w.score_from, w.end - w.start - 1)]
    assert scored == list(range(1, n))


def test_rolling_perplexity_equals_full_context_when_it_fits(base, tok):
    ids = tok("The national executive appointed a senator as interim leader in 2001.")["input_ids"]
    enc = [Encoded("a", ids, [False] * len(ids))]
    r = run_forced(base, base, enc, ForcedRequest(max_len=512, batch_tokens=512), pad=0)
    with torch.no_grad():
        logits = base(torch.tensor([ids])).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum")
    s = forced_summary(r)
    assert s["tokens"] == len(ids) - 1
    assert abs(s["ppl_base"] - math.exp(float(nll) / (len(ids) - 1))) < 1e-3 * s["ppl_base"]
    assert s["kl_mean"] < 1e-6 and s["top1_agreement"] == 1.0 and abs(s["ppl_increase"]) < 1e-9


def test_windows_shorter_than_text_still_score_every_token(base, tok):
    ids = tok("0123456789 " * 30)["input_ids"][:200]
    enc = [Encoded("a", ids, [True] * len(ids))]
    short = forced_summary(run_forced(base, base, enc, ForcedRequest(max_len=64, batch_tokens=256), pad=0))
    assert short["tokens"] == len(ids) - 1 and short["focus_tokens"] == len(ids) - 1
