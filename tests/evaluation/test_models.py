"""The forward split in two (body once, head over a few positions at a time) gives the model's
own logits, soft-capping included, for right-padded batches; the teacher-forced pass built on it
scores views of the candidate against the same baseline logits."""
import contextlib
import copy

import pytest
import torch
from arch_configs import tiny_config
from transformers import AutoModelForCausalLM

from quantkit.evaluation.forced import Encoded, ForcedRequest, run_forced
from quantkit.evaluation.measures import forced_summary
from quantkit.evaluation.causal_lm import body_states, forward_logits, head_logits, position_chunks


def _model(arch: str, **extra):
    torch.manual_seed(0)
    cfg = tiny_config(arch)
    for k, v in extra.items():
        setattr(cfg, k, v)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch, extra", [("LlamaForCausalLM", {}),
                                          ("Gemma3ForCausalLM", {"final_logit_softcapping": 3.0})])
def test_head_over_chunks_equals_the_full_forward(arch, extra):
    model = _model(arch, **extra)
    seqs = [list(range(3, 40)), list(range(5, 20))]   # right-padded: padding rows must match too
    full = forward_logits(model, seqs, pad=0)
    states = body_states(model, seqs, pad=0)
    parts = [head_logits(model, states[:, a:b]) for a, b in position_chunks(states.shape[1], 2, 16)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    if extra:   # soft-capping really ran: |logits| < cap
        assert float(full.abs().max()) < 3.0
    assert type(model.model).__name__.endswith("Model")   # the body is back in place


def test_views_score_against_the_same_baseline(base, tok):
    ids = tok("The national executive appointed a senator as interim leader in 2001. " * 8)["input_ids"]
    enc = [Encoded("a", ids, [False] * len(ids))]
    noisy = copy.deepcopy(base)
    with torch.no_grad():
        noisy.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    entered = []

    @contextlib.contextmanager
    def as_is(m):
        entered.append(m)
        yield m

    r = run_forced(base, noisy, enc, ForcedRequest(max_len=64, batch_tokens=256, bucket_positions=True,
                                                 chunk_tokens=24), pad=0,
                   views={"same": as_is, "baseline": lambda m: contextlib.nullcontext(base)})
    main = forced_summary(r)
    assert r.views["same"]["kl_mean"] == pytest.approx(main["kl_mean"], rel=1e-6) and main["kl_mean"] > 1e-3
    assert r.views["same"]["buckets"] == r.buckets
    assert r.views["baseline"]["kl_mean"] < 1e-6 and r.views["baseline"]["top1_agreement"] == 1.0
    assert r.views["same"]["tokens"] == main["tokens"] == len(ids) - 1
    assert all(m is noisy for m in entered) and entered
    assert r.deepest == 63 and main["last_bucket_end"] == 64


def test_greedy_stops_rows_early_and_keeps_their_tokens(base, tok):
    from quantkit.evaluation.causal_lm import greedy
    prompts = [tok("def add(a, b):\n")["input_ids"], tok("The total was 1,200 yuan")["input_ids"]]
    full = greedy(base, prompts, 20, pad=0, eos=None)
    calls = []
    handle = base.register_forward_hook(lambda *a: calls.append(1))
    try:
        early = greedy(base, prompts, 20, pad=0, eos=None, stop=lambda ids: len(ids) >= 3 + ids[0] % 3)
    finally:
        handle.remove()
    assert all(len(r) == 20 for r in full)
    for f, e in zip(full, early):   # each row is the full run's opening, to its own stop
        n = 3 + f[0] % 3
        assert e[:n] == f[:n]
    assert len(calls) <= 5 < 20     # generation ended when every row had stopped
