"""The one-pass damage scores against a plain autograd reference, and the exact KL they predict."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from quantkit.pipeline.batches import make_chunks
from quantkit.recipe import load_recipe
from quantkit.sensitivity import SearchOptions, candidates_from, sensitivity_search
from quantkit.sensitivity.exact import ExactKL, substituted
from quantkit.sensitivity import exact as exact_module
from quantkit.sensitivity.scores import error_terms, gradient_scores, sample_ids

from model_factory import random_ids

LINEAR = "model.layers.1.self_attn.o_proj"


@pytest.fixture(scope="module")
def model(tiny_llama):
    return AutoModelForCausalLM.from_pretrained(tiny_llama).eval()


def _packed_chunk():
    # three samples of different lengths in rows of 20: two share a row, the rest is padding
    samples = [s[:n] for s, n in zip(random_ids(3, 20, seed=4), (20, 12, 6))]
    chunks = make_chunks(samples, 4096, packed=True)
    assert len(chunks) == 1 and chunks[0].valid is not None
    return chunks[0], samples


def test_error_terms_by_hand():
    g = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    dy = torch.tensor([[1.0, 1.0], [1.0, 2.0], [2.0, 0.0]])
    t = error_terms(g, dy, torch.tensor([0, 0, 1]), 2)
    # g*dy = [[1, 2], [3, -2], [1, 0]]; per token 3, 1, 1; per sample 4, 1
    assert (t.diag, t.token, t.sample, t.local) == (19.0, 11.0, 17.0, 11.0)


def test_sample_ids_follow_the_packing():
    chunk, _ = _packed_chunk()
    ids, n = sample_ids(chunk)
    valid = chunk.valid.reshape(-1)
    assert n >= 3 and len(torch.unique(ids[valid])) == 3


def test_one_pass_equals_autograd_on_the_output(model):
    """The hooks' sums equal those formed from a plain backward with the output's .grad."""
    chunk, _ = _packed_chunk()
    w = dict(model.named_modules())[LINEAR].weight
    dw = 0.01 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1))
    got = gradient_scores(model, {LINEAR: {"c": dw}}, [chunk], labels="data")

    captured = {}
    module = dict(model.named_modules())[LINEAR]

    def keep(m, args, out):
        out.retain_grad()
        captured.update(x=args[0].detach(), y=out)
    # input_ids, no cache: only then does transformers build the packed rows' block mask
    hooks = [module.register_forward_hook(keep),
             model.get_input_embeddings().register_forward_hook(lambda m, a, o: o.requires_grad_())]
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        logits = model(input_ids=chunk.input_ids, position_ids=chunk.position_ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    ids, mask, pos = chunk.input_ids, chunk.valid, chunk.position_ids
    keep_pos = mask[:, :-1] & mask[:, 1:] & (pos[:, 1:] != 0)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1][keep_pos], ids[:, 1:][keep_pos], reduction="sum")
    loss.backward()
    g = captured["y"].grad[mask]
    dy = captured["x"][mask] @ dw.T
    seg, n = sample_ids(chunk)
    want = error_terms(g, dy, seg[mask.reshape(-1)], n)
    sums = got.sums[LINEAR]["c"]
    for k in ("diag", "token", "sample", "local"):
        assert getattr(sums, k) == pytest.approx(getattr(want, k), rel=1e-6), k
    assert got.tokens == int(keep_pos.sum())


def test_exact_kl_is_zero_unchanged_and_restores_the_weights(model, monkeypatch):
    chunk, _ = _packed_chunk()
    w = dict(model.named_modules())[LINEAR].weight
    before = w.detach().clone()
    kl = ExactKL(model, [chunk])
    assert abs(kl({LINEAR: before})) < 1e-7
    noisy = before + 0.05 * torch.randn(before.shape, generator=torch.Generator().manual_seed(2))
    cached = kl({LINEAR: noisy})
    assert cached > 1e-4 and torch.equal(w, before)
    monkeypatch.setattr(exact_module, "CACHE_FLOATS", 1)   # recompute the reference instead of keeping it
    assert ExactKL(model, [chunk])({LINEAR: noisy}) == pytest.approx(cached, rel=1e-6)
    with substituted(model, {LINEAR: noisy}):
        assert torch.equal(w, noisy)
    assert torch.equal(w, before)


def test_search_predicts_the_exact_kl_and_ranks_formats(model, tiny_llama):
    """On a tiny model the diagonal Fisher score is the exact KL to within a factor of 2, per
    unit; W8 scores far below W4; a kept unit costs nothing; sizes come with every fitting format."""
    recipe = load_recipe("w4a16-g64")
    cands = candidates_from(["W4_G32", "W4_G128", "W8_CHANNEL", "KEEP"], None, "c")
    s = sensitivity_search(model, AutoConfig.from_pretrained(tiny_llama), recipe, random_ids(8, 64), cands,
                           SearchOptions(exact_units=8, exact_candidates=["W4_G32"]))
    assert len(s.exact) == 8
    for u in s.units:
        assert ("W4_G128" in s.nbytes[u.name]) == u.name.endswith("down_proj")   # the only input 128 wide
        assert s.damage(u.name, "KEEP") == 0.0
        assert 0 < s.damage(u.name, "W8_CHANNEL") < s.damage(u.name, "W4_G32") / 50
        ratio = s.damage(u.name, "W4_G32") / s.exact[u.name]["W4_G32"]
        assert 0.2 < ratio < 2.0, (u.name, ratio)
    assert s.agreement["spearman"]["diag"]["W4_G32"] > 0.5
