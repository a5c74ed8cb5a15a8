"""The served passes score several slices at once (a server batches the decode steps of every
request in flight): the figures are those of one slice at a time, the requests of different slices
really overlap, and after an error no slice goes on asking the server."""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager

import pytest
import torch
from tiny import _take, fake_quant_linears

import quantkit.evaluation.evaluator as api
from quantkit.evaluation.evaluator import evaluate_served
from quantkit.evaluation.backends.served import ServedModel
from quantkit.evaluation.slices import SuiteOptions, load_suite
from quantkit.serving.client import EngineError

OPTS = SuiteOptions(text_items=3, item_tokens=96, gen_prompts=3, gen_tokens=6, extract_items=3, extract_tokens=6,
                    mc_items=3)


class FakeServer:
    """What a ``/v1/completions`` endpoint answers (token ids, ``echo`` with top-k logprobs, greedy
    continuations), computed by a model in this process; it counts the requests in flight and
    answers an error to a prompt that ``fail_on`` says to."""

    def __init__(self, model, pause_s: float = 0.02, fail_on=None) -> None:
        self.model, self.pause_s, self.fail_on = model, pause_s, fail_on
        self.url, self.model_name, self.flag, self.max_model_len = "http://fake", "fake", "--endpoint", 256
        self.lock, self.in_flight, self.most, self.calls, self.last_call = threading.Lock(), 0, 0, 0, 0.0

    def completions(self, body: dict, timeout_s: float = 600.0, cancel=None) -> dict:
        with self.lock:
            self.in_flight += 1
            self.calls += 1
            self.most, self.last_call = max(self.most, self.in_flight), time.monotonic()
        try:
            time.sleep(self.pause_s)   # a server's latency: requests sent together are in flight together
            if self.fail_on is not None and self.fail_on(body["prompt"]):
                raise EngineError("--endpoint: http://fake/v1/completions: HTTP 500")
            return {"choices": [self._answer(body)]}
        finally:
            with self.lock:
                self.in_flight -= 1

    def _answer(self, body: dict) -> dict:
        ids, k = list(body["prompt"]), body.get("logprobs") or 0
        with torch.no_grad():
            if body.get("echo"):
                logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].double(), -1)
                return {"logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                     "token_logprobs": [None] + [float(logp[j - 1, ids[j]]) for j in range(1, len(ids))],
                                     "top_logprobs": [None] + [_top(logp[j - 1], k) for j in range(1, len(ids))]}}
            out = []
            for _ in range(body["max_tokens"]):
                logp = torch.log_softmax(self.model(torch.tensor([ids + out])).logits[0, -1].double(), -1)
                if k and not out:
                    first = _top(logp, k)
                out.append(int(logp.argmax()))
        return {"token_ids": out, **({"logprobs": {"top_logprobs": [first]}} if k else {})}


def _top(logp: torch.Tensor, k: int) -> dict:
    v, i = logp.topk(k)
    return {f"token_id:{int(t)}": float(x) for t, x in zip(i, v)}


class FakeServed:
    """``ServedModels`` over two fake servers."""

    def __init__(self, base: FakeServer, cand: FakeServer, tok) -> None:
        self.servers, self.tok = {"baseline": base, "candidate": cand}, tok
        self.max_len, self.max_len_source, self.max_window, self.baseline_folder = 256, "test", 256, None

    @contextmanager
    def _open(self, which: str):
        yield ServedModel(self.servers[which], self.tok, 20)

    def baseline(self):
        return self._open("baseline")

    def candidate(self):
        return self._open("candidate")

    def path_check(self):
        return None

    def settings(self) -> dict:
        return {"engine": "fake"}

    def not_measured(self) -> list[str]:
        return []


@pytest.fixture(scope="module")
def suite():
    # short texts only: one window a text
    return [_take(s, 3) for s in load_suite("numbers-en,names-en,knowledge-en")]


def _evaluate(servers: tuple[FakeServer, FakeServer], tok, suite, at_once: int, monkeypatch):
    monkeypatch.setattr(api, "SLICES_AT_ONCE", at_once)
    return evaluate_served(FakeServed(*servers, tok), tok, suite=suite, max_len=256, options=OPTS, progress=False,
                           languages="en")


def test_slices_scored_at_once_give_the_figures_of_one_at_a_time(base, tok, suite, monkeypatch):
    cand = fake_quant_linears(base, 4)
    b1, c1, b3, c3 = (FakeServer(m, pause_s=0.1) for m in (base, cand, base, cand))
    one = _evaluate((b1, c1), tok, suite, 1, monkeypatch)
    many = _evaluate((b3, c3), tok, suite, 3, monkeypatch)
    # one slice at a time, the most in flight is one call's requests; at once, calls of several slices
    assert max(b1.most, c1.most) < min(b3.most, c3.most), (b1.most, c1.most, b3.most, c3.most)
    assert (b1.calls, c1.calls) == (b3.calls, c3.calls)
    assert set(one.slices) == {"numbers-en", "names-en", "knowledge-en"}
    assert {"gen_agreement", "extract_f1_cand", "kl_mean"} <= set(one.slices["numbers-en"])
    assert "mc_accuracy_cand" in one.slices["knowledge-en"]
    for name, values in one.slices.items():
        for key, v in values.items():
            w = many.slices[name][key]
            assert v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), (name, key, v, w)
    assert one.verdict.decision == many.verdict.decision
    assert set(many.meta["seconds_per_slice"]) == set(one.slices) and not many.meta["cpu_seconds_per_slice"]


def test_after_one_slice_fails_no_other_slice_goes_on_asking(base, tok, suite, monkeypatch):
    calls = iter(range(10**6))
    fifth = lambda prompt: next(calls) == 4   # noqa: E731  (slices are scoring side by side by then)
    server = FakeServer(base, pause_s=0.05, fail_on=fifth)
    with pytest.raises(EngineError, match="HTTP 500"):
        _evaluate((server, FakeServer(base)), tok, suite, 3, monkeypatch)
    raised = time.monotonic()
    time.sleep(1.0)
    # the requests in flight ended; none started after the error reached the caller
    assert server.last_call < raised and server.calls < 40, (server.calls, server.last_call - raised)
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("quantkit-slice"))


def test_a_closed_model_sends_nothing_more(base, tok):
    server = FakeServer(base)
    model = ServedModel(server, tok, 5)
    assert len(model.generate([[5, 6, 7]], 2)[0]) == 2
    model.close()
    with pytest.raises(EngineError, match="stopped"):
        model.generate([[5, 6, 7]], 2)
    assert server.calls == 1


def test_every_answer_is_counted_for_the_progress_bar(base, tok):
    """A pass's slices end together, late: the bar moves with each answer instead."""
    model = ServedModel(FakeServer(base, pause_s=0.01), tok, 5)
    told: list[int] = []
    model.on_answer = told.append
    model.score([[5, 6, 7, 8]] * 6)
    model.generate([[5, 6, 7]] * 3, 2)
    assert sorted(told) == list(range(1, 10)) and model.answered == 9
