"""AWQ: the clip search's Gram form equals the brute-force output error; AWQ beats RTN where
activations have salient channels; a saved result re-applies to the same checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.transforms.awq import apply_clip, candidate_scales, clip_search, fake_quantize_weight
from quantkit.config.scheme import QuantArgs

from model_factory import make_outlier_llama_dir, random_ids


@pytest.mark.parametrize("symmetric", [True, False])
def test_clip_search_minimises_each_groups_output_error(symmetric):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 48, generator=g)
    x = torch.randn(300, 48, generator=g) * torch.linspace(0.2, 3.0, 48)
    args = QuantArgs(num_bits=3, group_size=16, symmetric=symmetric)
    gram = torch.stack([x[:, k:k + 16].T @ x[:, k:k + 16] for k in range(0, 48, 16)]) / x.shape[0]
    ratios = clip_search(w, gram, args, grid=10, max_shrink=0.5)
    candidates = [1.0 - i / 10 for i in range(6)]
    for o in range(6):
        for grp in range(3):
            cols = slice(16 * grp, 16 * grp + 16)

            def err(c):   # the definition: mean squared output error of this group's slice
                r = torch.ones(6, 3)
                r[o, grp] = c
                d = w - fake_quantize_weight(apply_clip(w, r, symmetric), args)
                return float(((x[:, cols] @ d[o, cols]) ** 2).mean())

            errors = [err(c) for c in candidates]
            assert err(float(ratios[o, grp])) <= min(errors) * (1 + 1e-5)
    assert float(ratios.min()) < 1.0   # some group is clipped: the search is not a no-op here


def test_candidate_scales_are_normalised_and_follow_the_ratio():
    x_mean = torch.tensor([0.1, 1.0, 10.0])
    s0, s1 = candidate_scales(x_mean, None, 0.0), candidate_scales(x_mean, None, 1.0)
    assert torch.allclose(s0, torch.ones(3))
    assert torch.allclose(s1.max() * s1.min(), torch.tensor(1.0)) and s1.argmax() == 2


@pytest.fixture(scope="module")
def salient_llama(tmp_path_factory):
    """A tiny Llama whose norms make a few input channels much larger: AWQ's case."""
    return make_outlier_llama_dir(tmp_path_factory.mktemp("salient") / "llama", outliers=6, factor=12.0,
                                  spread=1.0, seed=3)


def _block_errors(src, out) -> float:
    """Relative output error of every attention block and MLP, fed the float model's hidden states.

    On held-out tokens. Block by block, not end to end: a random model is chaotic (any error
    grows to the same size by the last layer), so only what each searched module computes
    tells the methods apart.
    """
    ref = AutoModelForCausalLM.from_pretrained(src).eval()
    cand = quantkit.load(out, backend="torch").eval()
    ids = torch.tensor(random_ids(4, 48, seed=11))
    err = sig = 0.0
    with torch.no_grad():
        hidden = ref(ids, output_hidden_states=True).hidden_states
        pos = ref.model.rotary_emb(hidden[0], torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1))
        for i, (r, c) in enumerate(zip(ref.model.layers, cand.model.layers)):
            x = hidden[i]
            a = r.self_attn(r.input_layernorm(x), position_embeddings=pos, attention_mask=None)[0]
            b = c.self_attn(c.input_layernorm(x), position_embeddings=pos, attention_mask=None)[0]
            m, n = r.mlp(r.post_attention_layernorm(x)), c.mlp(c.post_attention_layernorm(x))
            err += float((a - b).pow(2).sum() / a.pow(2).sum() + (m - n).pow(2).sum() / m.pow(2).sum())
            sig += 2
    return err / sig


def test_awq_beats_rtn_and_clip_helps(salient_llama, tmp_path):
    calib = random_ids(16, 64, seed=1)
    errors = {}
    for label, steps in {"rtn": ["rtn"], "noclip": [{"awq": {"clip": False}}, "rtn"], "awq": ["awq", "rtn"]}.items():
        q = quantkit.quantize(salient_llama, {"scheme": "W4A16", "group_size": 32, "steps": steps}, calibration=calib)
        errors[label] = _block_errors(salient_llama, q.save(tmp_path / label))
    assert errors["noclip"] < 0.8 * errors["rtn"], errors
    assert errors["awq"] < 0.95 * errors["noclip"], errors


def test_scoring_each_ratio_with_its_clip_ranges_helps(salient_llama, tmp_path):
    calib = random_ids(16, 64, seed=1)
    errors = {}
    for label, options in {"awq": {}, "joint": {"clip_in_search": True}}.items():
        q = quantkit.quantize(salient_llama, {"scheme": "W4A16", "group_size": 32,
                                              "steps": [{"awq": options}, "rtn"]}, calibration=calib)
        errors[label] = _block_errors(salient_llama, q.save(tmp_path / label))
    assert errors["joint"] < 0.95 * errors["awq"], errors


def test_saved_result_reapplies_to_the_same_checkpoint(salient_llama, tmp_path):
    calib = random_ids(16, 64, seed=1)
    first = quantkit.quantize(salient_llama, {"scheme": "W4A16", "group_size": 32, "steps": ["awq", "rtn"]},
                              calibration=calib).save(tmp_path / "first")
    log = json.loads((first / "quantization_log.json").read_text())
    layer0 = log["transforms"]["model.layers.0"]["0.awq"]
    assert 0.0 <= layer0["input_layernorm"]["ratio"] < 1.0
    assert layer0["input_layernorm"]["loss_awq"] <= layer0["input_layernorm"]["loss_rtn"]
    # other calibration data: only the saved result can make the checkpoint identical
    again = quantkit.quantize(salient_llama, {"scheme": "W4A16", "group_size": 32,
                                              "steps": [{"awq": {"load_from": str(first)}}, "rtn"]},
                              calibration=random_ids(16, 64, seed=2)).save(tmp_path / "again")
    with safe_open(first / "model.safetensors", "pt") as a, safe_open(again / "model.safetensors", "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k
    assert json.loads((again / "quantization_log.json").read_text())["transforms"] == log["transforms"]


def test_load_from_a_folder_without_transforms_is_one_line(salient_llama, tmp_path):
    from quantkit.errors import QuantkitError

    with pytest.raises(QuantkitError, match="load_from: .* holds no saved transforms"):
        quantkit.quantize(salient_llama, {"scheme": "W4A16", "group_size": 32,
                                          "steps": [{"awq": {"load_from": str(tmp_path)}}, "rtn"]},
                          calibration=random_ids(4, 32))


def test_no_scaling_wins_where_every_scaled_grid_loses():
    """With duo scaling no ratio gives s = 1; the search must still keep the layer unscaled
    when that is best (here a replay that only rewards the unscaled rounding)."""
    from types import SimpleNamespace

    from quantkit.transforms.awq import AWQ, fake_quantize_weight, minmax
    from quantkit.transforms.observe import ChannelStats
    from quantkit.arch.spec import SmoothMapping
    from quantkit.config.scheme import QuantArgs

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 16, bias=False)
    args = QuantArgs(num_bits=4, group_size=32)
    plain = fake_quantize_weight(lin.weight.data.clone(), minmax(args))

    class Replay:
        num_tokens, parts = 1, 1

        def squared_error(self, part: int) -> tuple[float, int]:
            return float((lin.weight.data - plain).abs().sum()), 1

    layer = torch.nn.Module()
    layer.norm, layer.fc = torch.nn.LayerNorm(64), lin
    ctx = SimpleNamespace(targets={"fc": (lin, SimpleNamespace(weights=args))}, layer=layer, config=None)
    stats = ChannelStats(torch.rand(64) * 10 + 0.1, torch.ones(64), count=1)
    before = lin.weight.data.clone()
    s, info = AWQ()._search_mapping(ctx, SmoothMapping("norm", ("fc",), "fc"), stats, Replay())
    assert info["ratio"] is None and torch.equal(s, torch.ones(64)), info
    assert info["loss_awq"] == info["loss_rtn"] == 0.0
    assert torch.equal(lin.weight.data, before)          # the search leaves the weights as they were


@pytest.mark.parametrize("left_padded", [False, True])
def test_skip_first_leaves_each_rows_first_real_token_out(left_padded):
    """``skip_first=1``: statistics, Gram blocks and replays see every real token but the first
    of each row (the attention sink), also when rows are padded on the left."""
    from types import SimpleNamespace

    from quantkit.transforms.observe import observe_layer

    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.fc = torch.nn.Linear(8, 3, bias=False)
    batches = [torch.randn(2, 5, 8) for _ in range(2)]
    valid = torch.ones(2, 5, dtype=torch.bool)
    if left_padded:
        valid[1, :2] = False            # row 1 starts at position 2
    first = valid.int().cumsum(1) == 1  # each row's first real token
    current = {"i": None}

    def forward_batches(batches_=None):
        for i, x in enumerate(batches):
            current["i"] = i
            layer.fc(x)
        current["i"] = None

    ctx = SimpleNamespace(layer=layer, forward_batches=forward_batches, batch_index=lambda: current["i"],
                          tokens=lambda x: x[valid])
    stats, replays = observe_layer(ctx, ["fc"], ["fc"], [0], {"fc": 4}, skip_first=1)
    seen = torch.cat([x[valid & ~first] for x in batches])
    assert stats["fc"].count == seen.shape[0] == 2 * (int(valid.sum()) - 2)
    assert torch.allclose(stats["fc"].abs_mean, seen.abs().mean(0))
    g = seen.view(-1, 2, 4).transpose(0, 1)
    assert torch.allclose(stats["fc"].gram, g.transpose(1, 2) @ g, atol=1e-5)
    assert replays["fc"].num_tokens == int((valid & ~first).sum())
    assert torch.allclose(replays["fc"].reference[0], layer.fc(batches[0])[valid & ~first])


def test_linears_reading_one_input_get_its_statistics_and_the_whole_grams_blocks():
    """Two linears fed the same tensor (q/k/v, gate/up) share every statistic computed from it; a
    linear whose whole Gram is kept gets its group blocks from that Gram's diagonal."""
    from types import SimpleNamespace

    from quantkit.transforms.observe import observe_layer

    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.a, layer.b = torch.nn.Linear(8, 3, bias=False), torch.nn.Linear(8, 5, bias=False)
    batches = [torch.randn(2, 5, 8) for _ in range(3)]

    def forward_batches(batches_=None):
        for x in batches:
            layer.a(x), layer.b(x)

    ctx = SimpleNamespace(layer=layer, forward_batches=forward_batches, batch_index=lambda: None,
                          tokens=lambda x: x.reshape(-1, x.shape[-1]))
    stats, _ = observe_layer(ctx, ["a", "b"], [], [], {"a": 4, "b": 4}, full_gram={"b"})
    x = torch.cat([t.reshape(-1, 8) for t in batches])
    g = x.view(-1, 2, 4).transpose(0, 1)
    blocks = g.transpose(1, 2) @ g / x.shape[0]
    for name in ("a", "b"):
        assert stats[name].count == x.shape[0]
        assert torch.allclose(stats[name].abs_mean, x.abs().mean(0))
        assert torch.equal(stats[name].abs_max, x.abs().amax(0))
        torch.testing.assert_close(stats[name].group_gram(), blocks, rtol=1e-5, atol=1e-5)
    assert stats["b"].gram is None   # not accumulated twice
    torch.testing.assert_close(stats["b"].full_gram(), x.T @ x / x.shape[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("symmetric", [True, False])
def test_refine_clip_lowers_each_rows_whole_output_error(symmetric):
    """With inputs correlated across groups, the sweeps lower every row's error ``d^T H d`` from
    the per-group search's, and end where no single group's ratio change lowers it further."""
    from quantkit.transforms.awq import refine_clip

    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 48, generator=g)
    common = torch.randn(400, 1, generator=g)                 # one factor shared by every channel
    x = torch.randn(400, 48, generator=g) + 2.0 * common * torch.linspace(0.5, 1.5, 48)
    args = QuantArgs(num_bits=3, group_size=16, symmetric=symmetric)
    h = x.T @ x / x.shape[0]
    blocks = torch.stack([h[k:k + 16, k:k + 16] for k in range(0, 48, 16)])
    start = clip_search(w, blocks, args, grid=10, max_shrink=0.5)
    refined = refine_clip(w, h, start, args, grid=10, max_shrink=0.5, sweeps=20)

    def row_errors(r):
        d = w - fake_quantize_weight(apply_clip(w, r, symmetric), args)
        return ((d @ h) * d).sum(-1)

    before, after = row_errors(start), row_errors(refined)
    assert torch.all(after <= before * (1 + 1e-5)) and float(after.sum()) < 0.95 * float(before.sum())
    for grp in range(3):
        for c in [1.0 - i / 10 for i in range(6)]:
            moved = refined.clone()
            moved[:, grp] = c
            assert torch.all(row_errors(moved) >= after * (1 - 1e-5))


def test_replay_split_first_scores_as_the_whole_call():
    """A captured attention call cut after its first rows gives, part by part, the same summed
    error as the whole call, for weights other than the float ones; a call whose arguments do
    not cut by rows stays whole."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from quantkit.transforms.observe import Replay

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    attn = model.model.layers[0].self_attn
    calls = []
    handle = attn.register_forward_pre_hook(lambda m, a, kw: calls.append((a, dict(kw))), with_kwargs=True)
    ids = torch.randint(0, 64, (4, 6))
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[3, :2] = 0                                     # a left-padded row: the mask must be cut too
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    handle.remove()
    args, kwargs = calls[0]
    keep = torch.nonzero(mask.flatten()).flatten()
    with torch.no_grad():
        ref = attn(*args, **kwargs)[0].reshape(-1, 32)[keep]
    whole = Replay(attn, [(args, kwargs, keep)], [ref])
    split = whole.split_first(tokens=7)                  # 7 kept tokens: the first two rows
    assert split.parts == 2 and split.num_tokens == whole.num_tokens
    assert split.calls[0][2].numel() == 12               # whole rows: 2 x 6
    attn.q_proj.weight.data += 0.05 * torch.randn_like(attn.q_proj.weight)
    e_whole, n_whole = whole.squared_error(0)
    parts = [split.squared_error(k) for k in range(split.parts)]
    assert sum(n for _, n in parts) == n_whole
    assert abs(sum(e for e, _ in parts) - e_whole) <= 1e-4 * e_whole

    class Fixed(torch.nn.Module):                        # an argument of its own batch size: not cut
        def forward(self, x, table):
            return x + table.sum(0)

    x = torch.randn(4, 3, 5)
    table = torch.randn(4, 3, 5)
    odd = Replay(Fixed(), [((x,), {"table": table}, torch.arange(12))], [(x + table.sum(0)).reshape(-1, 5)])
    assert odd.split_first(tokens=3).parts == 1
