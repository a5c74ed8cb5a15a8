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
from quantkit.evaluation.causal_lm import forward_logits
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


class _ListingServer:
    """A stand-in for a server over ``model``: the ``top_k`` most likely next tokens of a prompt, and
    a prompt's scores with every token listed; counts the prompts each call was sent."""

    def __init__(self, model, top_k: int) -> None:
        self.model, self.top_k, self.asked = model, top_k, {"next_token": 0, "score": 0}

    def next_token(self, prompts):
        self.asked["next_token"] += len(prompts)
        out = []
        for p in prompts:
            logp = torch.log_softmax(forward_logits(self.model, [p], 0)[0, -1], dim=-1)
            vals, ids = logp.topk(self.top_k)
            out.append(dict(zip(ids.tolist(), vals.double().tolist())))
        return out

    def score(self, seqs, k=None):
        self.asked["score"] += len(seqs)
        return [_served(self.model, s) for s in seqs]


@pytest.fixture(scope="module")
def letter_tokens():
    """The tiny tokenizer with " A".." D" as tokens of their own (so one request per question
    applies, as with SmolLM2's), and a tiny model over its vocabulary."""
    from tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer(380)
    tok.add_tokens([" A", " B", " C", " D"])
    return tiny_model(len(tok)), tok


@pytest.mark.parametrize("top_k", [2, 120, 384])
def test_served_multiple_choice_picks_as_the_in_process_pass(top_k, letter_tokens):
    """One request per question while a letter is among the listed next tokens; a question none of
    whose letters is listed is scored option by option; the picks are the in-process ones."""
    from quantkit.evaluation.backends.served import mc_picks
    from quantkit.evaluation.causal_lm import pad_id
    from quantkit.evaluation.slices import load_suite
    from quantkit.evaluation.task_metrics import mc_continuations, multiple_choice

    model, tok = letter_tokens
    items = load_suite("knowledge-en")[0].items[:12]
    assert all(len(c) == 1 for it in items for c in mc_continuations(tok, it)[1])
    server = _ListingServer(model, top_k)
    assert mc_picks(server, tok, items) == multiple_choice(model, tok, items, pad_id(tok))
    assert server.asked["next_token"] == len(items)
    # only the questions whose listing holds no letter are scored, option by option
    unlisted = [it for it in items for ctx, conts in [mc_continuations(tok, it)]
                if not {c[0] for c in conts} & set(server.next_token([ctx])[0])]
    assert server.asked["score"] == 4 * len(unlisted)
    if top_k == 120:   # some questions list a letter, some do not
        assert 0 < len(unlisted) < len(items)
    else:              # 2 tokens list no letter of this model's; the whole vocabulary lists them all
        assert len(unlisted) == {2: len(items), 384: 0}[top_k]
