"""Every evaluated KV option on a loaded model: quantkit's attention equals a textbook reference
(K and V quantize-dequantized as the cache holds them for each query, then plain softmax
attention), for GQA and for Gemma3's sliding-window layers, at lengths past KIVI's residual;
decoding through a cache equals the full forward; static scales come from the checkpoint or
from calibration (equal to the absmax of post-rope K and V); applying is undone on exit."""

import pytest
import torch
from arch_configs import tiny_config
from model_factory import make_llama_dir, random_ids
from transformers import AutoModelForCausalLM as AutoModel

import quantkit
from quantkit.errors import QuantkitError
from quantkit.kv_cache import FORMATS, PLAN_ATTR, apply_kv_option, kv_attention, kv_option, prepare_kv, weights_only

OPTIONS = [*FORMATS, "int8-kivi:k", "fp8-head:v"]
SEQ = 300   # past two of KIVI's 128-key flushes


def _model(arch: str, kv_heads: int):
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config(arch, kv_heads=kv_heads), dtype=torch.float32).eval()
    model.config.architectures = [arch]
    with torch.no_grad():   # larger-than-init weights: K and V ranges that quantization visibly rounds
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    return model



# -- an independent reference ------------------------------------------------------------------------
def _fp8(x, s):
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s


def _token_head(x, qmax, integer):
    s = (x.abs().amax(-1, keepdim=True) / qmax).clamp(min=1e-6)
    y = x * (1.0 / s)
    return (y.round().clamp(-128, 127) if integer else y.clamp(-448, 448).to(torch.float8_e4m3fn).float()) * s


def _minmax(x, dim):
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    s = (hi - lo) / 255
    return torch.where(s > 0, ((x - lo) / torch.where(s > 0, s, 1)).round().clamp(0, 255), 0) * s + lo


def _kivi_keys(k, below):
    out = k.clone()
    for g0 in range(0, below, 32):
        out[:, :, g0:g0 + 32] = _minmax(k[:, :, g0:g0 + 32], 2)
    return out


def _kivi_values(v):
    return torch.cat([_minmax(v[..., c:c + 32], -1) for c in range(0, v.shape[-1], 32)], dim=-1) \
        if v.shape[-1] % 32 == 0 else _minmax(v, -1)


def _reference(name: str, scales: dict):
    """K and V as ``name``'s cache holds them for the query at cache index t (no padding, so
    positions are indices), then softmax(q k^T * scaling + mask) v, one query at a time."""
    fmt, _, part = name.partition(":")
    parts = (part,) if part else ("k", "v")

    def quantized(module, x, which, t):
        if which not in parts:
            return x
        if fmt in ("fp8-tensor", "fp8-head"):
            return _fp8(x, scales[module.layer_idx][which == "v"])
        if fmt.endswith("token-head"):
            return _token_head(x, *((448.0, False) if fmt.startswith("fp8") else (127.0, True)))
        return _kivi_keys(x, 128 * ((t + 1) // 128)) if which == "k" else _kivi_values(x)

    def attention(module, query, key, value, mask, scaling=None, **kw):
        groups = query.shape[1] // key.shape[1]
        n, t_all = query.shape[2], key.shape[2]
        outs, held = [], {}   # held: the cache as it stands for one KIVI cutoff (else for every query)
        for i in range(n):
            t = t_all - n + i
            c = 128 * ((t + 1) // 128) if fmt == "int8-kivi" else 0
            if c not in held:
                held[c] = tuple(quantized(module, x, w, t).repeat_interleave(groups, 1)
                                for x, w in ((key, "k"), (value, "v")))
            k, v = held[c]
            s = query[:, :, i:i + 1] @ k.transpose(-1, -2) * scaling
            if mask is not None:
                s = s + mask[:, :, i:i + 1, :t_all]
            outs.append(torch.softmax(s.float(), -1).to(query.dtype) @ v)
        return torch.cat(outs, 2).transpose(1, 2).contiguous(), None

    return attention


def _checked(model, name: str, prepared, ids, base: str) -> tuple[torch.Tensor, float]:
    """Logits with ``prepared`` applied, each attention call also run through the reference on the
    very same inputs (quantization is discontinuous: a 1e-6 difference upstream can flip a code,
    so the two are compared call by call, not through the whole model); the largest difference."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    quantkit_fn, reference = kv_attention(base), _reference(name, prepared.scales)
    worst = []

    def check(module, query, key, value, mask, **kw):
        got = quantkit_fn(module, query, key, value, mask, **kw)
        n, t = query.shape[2], key.shape[2]
        if mask is None:   # plain causal: transformers skipped the mask
            mask = torch.ones(n, t, dtype=torch.bool).tril(t - n)[None, None]
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        want = reference(module, query, key, value, mask, **kw)
        worst.append(float((got[0] - want[0]).abs().max() / want[0].abs().max()))
        return got

    AttentionInterface.register("test_kv_check", check)
    AttentionMaskInterface.register("test_kv_check", ALL_MASK_ATTENTION_FUNCTIONS[base])
    with apply_kv_option(model, prepared):
        model.set_attn_implementation("test_kv_check")
        try:
            logits = model(ids).logits
        finally:
            model.set_attn_implementation(base)
    return logits, max(worst)


@pytest.fixture(scope="module")
def models():
    return {("LlamaForCausalLM", 2): _model("LlamaForCausalLM", 2), ("Gemma3ForCausalLM", 1): _model("Gemma3ForCausalLM", 1)}


# -- acceptance: equal to the reference, GQA and sliding window ---------------------------------------
@pytest.mark.parametrize("arch, kv_heads", [("LlamaForCausalLM", 2), ("Gemma3ForCausalLM", 1)])
@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_every_option_equals_qdq_then_plain_attention(models, arch, kv_heads, base):
    """4 query heads on 2 (Llama) or 1 (Gemma3) KV heads; Gemma3's layer 0 attends through a
    window of 6 over 300 positions (its mask made by transformers for each implementation)."""
    model = models[(arch, kv_heads)]
    model.set_attn_implementation(base)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (2, SEQ), generator=g)
    calib = torch.randint(0, 128, (3, 40), generator=g).tolist()
    with torch.no_grad():
        plain = model(ids).logits
        for name in OPTIONS:
            prepared = prepare_kv(model, kv_option(name), calibration=calib)
            with apply_kv_option(model, prepared) as m:
                got = m(ids).logits
            checked, worst = _checked(model, name, prepared, ids, base)
            assert torch.equal(checked, got)     # the checking run is the applied run
            assert worst < 1e-5, f"{name}: attention differs from the reference by {worst:.2e} (relative)"
            assert (got - plain).abs().max() > 1e-3, f"{name}: no KV error to see"
    assert model.config._attn_implementation == base


# -- decoding through a cache --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["int8-kivi", "int8-token-head", "fp8-token-head", "fp8-head"])
def test_decoding_token_by_token_equals_the_full_forward(models, name):
    """A prefill of 125 tokens, then 6 tokens one at a time, crossing KIVI's first flush at 128."""
    model = models[("LlamaForCausalLM", 2)]
    model.set_attn_implementation("sdpa")
    ids = torch.tensor(random_ids(1, 131, vocab=128, seed=7))
    prepared = prepare_kv(model, kv_option(name), calibration=ids[:, :40].tolist())
    with torch.no_grad(), apply_kv_option(model, prepared) as m:
        full = m(ids).logits[0, 124:]
        out = m(ids[:, :125], use_cache=True)
        steps, cache = [out.logits[0, -1]], out.past_key_values
        for t in range(125, 130):
            out = m(ids[:, t:t + 1], cache=cache, use_cache=True)
            steps.append(out.logits[0, -1])
            cache = out.past_key_values
    torch.testing.assert_close(torch.stack(steps), full[:6], rtol=1e-4, atol=1e-4)


def test_kivi_left_padded_batch_equals_each_row_alone(models):
    """Generation left-pads: positions come from position_ids, so a padded row's groups and
    cutoffs are its own and its padding never enters a group."""
    model = models[("LlamaForCausalLM", 2)]
    model.set_attn_implementation("sdpa")
    rows = random_ids(2, 140, vocab=128, seed=8)
    rows[1] = rows[1][:131]
    width = 140
    ids = torch.tensor([rows[0], [0] * (width - 131) + rows[1]])
    mask = torch.ones_like(ids)
    mask[1, :width - 131] = 0
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad(), apply_kv_option(model, "int8-kivi") as m:
        batch = m(ids, attention_mask=mask, position_ids=pos).logits
        alone = m(torch.tensor([rows[1]])).logits
    torch.testing.assert_close(batch[1, width - 131:], alone[0], rtol=1e-4, atol=1e-4)


# -- scales and what applying leaves behind -------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("kvapply")
    src = make_llama_dir(root / "src", heads=4, kv_heads=2)
    calib = random_ids(3, 20, seed=1)
    head = quantkit.quantize(str(src), {"scheme": "FP8_DYNAMIC", "kv_cache": {"strategy": "attn_head"}},
                             calibration=calib).save(root / "head")
    nokv = quantkit.quantize(str(src), "fp8-dynamic").save(root / "nokv")
    return {"src": src, "head": head, "nokv": nokv, "calib": calib}


def test_static_scales_from_the_checkpoint_else_calibrated(ckpts):
    head = quantkit.load(ckpts["head"])
    p = prepare_kv(head, kv_option("fp8-head"))
    assert p.source.startswith("checkpoint")
    assert torch.equal(p.scales[1][0], head.model.layers[1].self_attn.k_scale.float())
    with pytest.raises(QuantkitError, match=r"^--kv fp8-tensor: static scales need the checkpoint's per-tensor"):
        prepare_kv(head, kv_option("fp8-tensor"))    # per-head scales cannot be told per tensor
    calls = []
    t = prepare_kv(head, kv_option("fp8-tensor"), calibration=lambda: calls.append(1) or ckpts["calib"])
    assert calls == [1] and t.source.startswith("calibrated") and t.scales[0][0].shape == (1,)
    assert prepare_kv(head, kv_option("int8-kivi"), calibration=lambda: calls.append(2)).source.startswith("dynamic")
    assert calls == [1]   # dynamic formats never ask for rows


def test_calibrated_scales_are_the_absmax_of_post_rope_kv(ckpts):
    """On the float model, against the attention-interface route of tests/kv_cache/test_kv_cache_checkpoint.py."""
    from test_kv_cache_checkpoint import _post_rope_kv
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpts["src"]).eval()
    p = prepare_kv(model, kv_option("fp8-head"), calibration=ckpts["calib"])
    ref = _post_rope_kv(ckpts["src"], ckpts["calib"])
    for layer, (k, v) in ref.items():
        torch.testing.assert_close(p.scales[layer][0].flatten(), k / 448, rtol=1e-5, atol=0)
        torch.testing.assert_close(p.scales[layer][1].flatten(), v / 448, rtol=1e-5, atol=0)


def test_an_option_replaces_the_checkpoint_kv_and_exit_restores_it(ckpts):
    head, nokv = quantkit.load(ckpts["head"]), quantkit.load(ckpts["nokv"])
    ids = torch.tensor(random_ids(1, 40, seed=3))
    with torch.no_grad():
        before = head(ids).logits
        with apply_kv_option(head, "int8-token-head") as m:
            replaced = m(ids).logits
            with weights_only(m):
                bare = m(ids).logits
            assert torch.equal(m(ids).logits, replaced)
        with apply_kv_option(nokv, "int8-token-head") as m:
            same_weights = m(ids).logits
        after = head(ids).logits
        plain = nokv(ids).logits
    assert torch.equal(replaced, same_weights)   # the checkpoint's FP8 KV is not stacked under it
    assert torch.equal(bare, plain) and not torch.equal(before, plain)
    assert torch.equal(after, before) and head.config._attn_implementation == head.quantkit_info["attention"]
    assert not any(hasattr(m, PLAN_ATTR) for m in head.modules())


def test_kivi_calls_the_base_attention_on_query_blocks(models, monkeypatch):
    """At 1000 positions, no call of the base attention gets more than 128 queries or a mask
    larger than [128, 1000]: the blocks are what keeps long contexts within the base's memory."""
    from quantkit.kv_cache import attention as attention_module

    model = models[("LlamaForCausalLM", 2)]
    model.set_attn_implementation("sdpa")
    real = attention_module.base_function
    seen = []

    def recording(base, module):
        fn = real(base, module)

        def call(module, query, key, value, mask, **kw):
            seen.append((query.shape[2], key.shape[2], None if mask is None else tuple(mask.shape[-2:])))
            return fn(module, query, key, value, mask, **kw)
        return call

    monkeypatch.setattr(attention_module, "base_function", recording)
    ids = torch.tensor(random_ids(1, 1000, vocab=128, seed=9))
    with torch.no_grad(), apply_kv_option(model, "int8-kivi") as m:
        m(ids)
    assert len(seen) == 2 * (1000 // 128 + 1)   # two layers, one call per cutoff
    assert max(q for q, _, _ in seen) <= 128 and all(m is not None and m[0] == q and m[1] == k for q, k, m in seen)
    assert sorted({k for _, k, _ in seen}) == [127 + 128 * i for i in range(7)] + [1000]
