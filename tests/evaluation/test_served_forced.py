"""The served teacher-forced pass reads a server's answers at the right positions: with every
token listed (k = the vocabulary) it gives what the in-process pass gives on the same windows."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from model_factory import make_llama_dir
from quantkit.evaluation.backends.served import WindowScores, window_scores
from quantkit.evaluation.backends.served_forced import served_forced
from quantkit.evaluation.forced import Encoded, ForcedRequest, forced_jobs, run_forced
from quantkit.evaluation.models import forward_logits
from quantkit.serving.client import EngineError


def _served(model, seq: list[int]) -> WindowScores:
    """What a server returns for ``seq`` with every token listed: position j holds the prediction of token j."""
    logp = torch.log_softmax(forward_logits(model, [seq], 0)[0], dim=-1).double().numpy()
    n, vocab = len(seq), logp.shape[1]
    ids = np.tile(np.arange(vocab), (n, 1))
    lps = np.full((n, vocab), -np.inf)
    lps[1:] = logp[:-1]
    target = np.array([math.nan] + [logp[j - 1, seq[j]] for j in range(1, n)])
    return WindowScores(target, ids, lps)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("served")
    return [AutoModelForCausalLM.from_pretrained(make_llama_dir(root / f"m{s}", seed=s)).eval() for s in (0, 1)]


def test_served_pass_equals_the_in_process_pass_when_every_token_is_listed(models):
    base, cand = models
    g = torch.Generator().manual_seed(0)
    encoded = [Encoded(f"t{i}", torch.randint(3, 256, (n,), generator=g).tolist(), [i % 3 == 0 for i in range(n)])
               for i, n in enumerate((300, 90, 2))]
    encoded[1].scored = [k % 2 == 0 for k in range(90)]   # a chat row: only some tokens are scored
    request = ForcedRequest(max_len=128, batch_tokens=1024, bucket_positions=True)
    own = run_forced(base, cand, encoded, request, 0)
    jobs = list(forced_jobs(encoded, request.max_len))
    seqs = [encoded[k].ids[w.start:w.end] for k, w in jobs]
    got = served_forced(encoded, request, jobs, [_served(base, s) for s in seqs], [_served(cand, s) for s in seqs])
    assert [s.tokens for s in got.items] == [s.tokens for s in own.items] == [299, 44, 1]   # token 0 is never predicted
    for a, b in zip(got.items, own.items):
        assert a.top1 == b.top1 and a.focus_tokens == b.focus_tokens and a.worst_pos == b.worst_pos
        for f in ("nll_base", "nll_cand", "kl_sum", "focus_kl_sum"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-4, abs=1e-5), f
    assert [r["tokens"] for r in got.buckets] == [r["tokens"] for r in own.buckets]
    assert [r["kl_mean"] for r in got.buckets] == pytest.approx([r["kl_mean"] for r in own.buckets], rel=1e-4)
    assert got.deepest == own.deepest == 127


def test_an_answer_for_other_tokens_or_as_text_is_refused():
    choice = {"logprobs": {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [None, -1.0],
                           "top_logprobs": [None, {"token_id:7": -1.0, "token_id:2": -0.5}]}}
    s = window_scores(choice, [5, 7])
    assert s.target[1] == -1.0 and s.argmax(1, 2).tolist() == [2]
    with pytest.raises(EngineError, match="other tokens than the prompt"):
        window_scores(choice, [5, 8])
    text = {"logprobs": {"tokens": ["The", " cat"], "token_logprobs": [None, -1.0], "top_logprobs": [None, {" cat": -1}]}}
    with pytest.raises(EngineError, match="return_tokens_as_token_ids"):
        window_scores(text, [5, 7])
