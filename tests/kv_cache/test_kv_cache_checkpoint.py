"""FP8 KV cache: the recipe key, calibration on post-rope K, the checkpoint's scales (checked
against compressed-tensors' own initialisation), the quantized-KV attention of ``quantkit.load``
(equal to quantize-dequantize-then-plain-attention, GQA and Gemma3's sliding window), loading in
transformers + compressed-tensors, and the integrity pass over the scales."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from arch_configs import tiny_config
from model_factory import make_llama_dir, random_ids
from safetensors.torch import load_file, save_file

import quantkit
from quantkit.errors import QuantkitError
from quantkit.kv_cache import KVCacheScheme, fake_quantize_fp8, mse_range, use_kv_attention
from quantkit.recipe import Recipe

STRATEGIES = ("tensor", "attn_head")
KV_HEADS, HEAD_DIM = 2, 16
# varied lengths: calibration packs them into rows with padding, which the observer must skip
CALIB = [ids[:n] for ids, n in zip(random_ids(3, 20, seed=1), (20, 12, 7))]


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in folder.glob("*.safetensors"):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_llama_dir(tmp_path_factory.mktemp("kv") / "src", heads=4, kv_heads=KV_HEADS)


@pytest.fixture(scope="module")
def checkpoints(src) -> dict[str, Path]:
    root = src.parent
    return {s: quantkit.quantize(str(src), {"scheme": "FP8_DYNAMIC", "kv_cache": {"strategy": s}},
                                 calibration=CALIB).save(root / s) for s in STRATEGIES}


# -- the recipe key ----------------------------------------------------------------------------------
def test_recipe_key_defaults_and_form():
    r = Recipe.from_dict({"scheme": "FP8_DYNAMIC", "kv_cache": {}})
    assert r.kv_cache == KVCacheScheme() and r.kv_cache.strategy == "tensor"
    assert r.needs_calibration
    assert r.to_dict()["kv_cache"]["strategy"] == "tensor"
    assert "kv_cache" not in Recipe.from_dict({"scheme": "FP8_DYNAMIC"}).to_dict()  # old resume keys unchanged
    shipped = Recipe.from_file(Path(__file__).resolve().parents[2] / "recipes" / "fp8-dynamic-kv-fp8.yaml")
    assert shipped.kv_cache.strategy == "tensor" and shipped.groups["group_0"].input_activations.dynamic
    assert Recipe.from_dict(shipped.to_dict()).kv_cache == shipped.kv_cache   # survives the log's form


@pytest.mark.parametrize("section, named", [
    ({"strategy": "channel"}, "recipe: kv_cache.strategy: must be 'tensor' or 'attn_head'"),
    ({"num_bits": 4}, "recipe: kv_cache.num_bits: the KV cache is FP8 E4M3 (8 bits), got 4"),
    ({"num_bits": 8.0}, "recipe: kv_cache.num_bits: expected an integer, got 8.0"),
    ({"symmetric": False}, "recipe: kv_cache.symmetric:"),
    ({"type": "int"}, "recipe: kv_cache.type: must be 'float'"),
    ({"observer": "percentile"}, "recipe: kv_cache.observer: must be 'minmax' or 'mse'"),
    ({"dynamic": True}, "recipe: kv_cache: unknown key 'dynamic'"),
    ("fp8", "recipe: kv_cache: expected a mapping"),
])
def test_recipe_key_bad_values_name_the_key(section, named):
    with pytest.raises(QuantkitError) as e:
        Recipe.from_dict({"scheme": "FP8_DYNAMIC", "kv_cache": section})
    assert str(e.value).startswith(named), str(e.value)
    assert "\n" not in str(e.value)


# -- the checkpoint: what compressed-tensors expects --------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_scales_match_compressed_tensors(checkpoints, strategy):
    """Names, shapes and dtypes as compressed-tensors' own ``initialize_attn_qparams`` makes them
    (its observed shape for k / v is ``(num_kv_heads, None, head_dim)``, dtype the attention
    module's), and the config parses as its ``QuantizationConfig``. Fails without the package."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig
    from compressed_tensors.quantization.lifecycle.initialize import initialize_qparams
    from compressed_tensors.quantization.quant_metadata import KVCacheScaleType

    ckpt = checkpoints[strategy]
    qc = json.loads((ckpt / "config.json").read_text())["quantization_config"]
    args = QuantizationConfig.model_validate(qc).kv_cache_scheme
    assert args == QuantizationArgs.model_validate(KVCacheScheme(strategy=strategy).to_dict())
    assert str(args.strategy.value if hasattr(args.strategy, "value") else args.strategy) == strategy
    assert args.num_bits == 8 and args.symmetric and not args.dynamic

    expected = torch.nn.Linear(4, 4)   # stands for the attention module: float32 parameters
    for base in ("k", "v"):
        initialize_qparams(expected, base, args, observed_shape=(KV_HEADS, None, HEAD_DIM),
                           observed_dtype=torch.float32, force_zero_point=False)
    names = [KVCacheScaleType.KEY.value, KVCacheScaleType.VALUE.value]
    tensors = _tensors(ckpt)
    for layer in range(2):
        for name in names:
            got = tensors[f"model.layers.{layer}.self_attn.{name}"]
            want = getattr(expected, name)
            assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype)
            assert not hasattr(expected, name.replace("scale", "zero_point"))
    assert not any(k.endswith(("k_zero_point", "v_zero_point")) for k in tensors)


def _post_rope_kv(src: Path, samples) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer, per-KV-head absmax of K and V as the float model's attention receives them,
    each sample alone (positions from 0): an independent route (the attention interface)."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(module, q, k, v, mask, **kw):
        ka, va = k.abs().amax(dim=(0, 2, 3)), v.abs().amax(dim=(0, 2, 3))
        old = seen.get(module.layer_idx)
        seen[module.layer_idx] = (ka, va) if old is None else (torch.maximum(old[0], ka), torch.maximum(old[1], va))
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, q, k, v, mask, **kw)

    AttentionInterface.register("test_record_kv", record)
    AttentionMaskInterface.register("test_record_kv", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model = AutoModelForCausalLM.from_pretrained(src, attn_implementation="test_record_kv").eval()
    with torch.no_grad():
        for ids in samples:
            model(torch.tensor([ids]))
    return seen


@pytest.mark.parametrize("strategy, quantizer", [("tensor", "rtn"), ("attn_head", "rtn"), ("attn_head", "gptq")])
def test_scales_are_the_absmax_of_post_rope_keys(src, tmp_path, strategy, quantizer):
    """Attention left unquantized, so the float model gives the very K and V of calibration
    (GPTQ: observed in its own lockstep pass, batch by batch)."""
    recipe = {"config_groups": {"g": {"targets": ["re:.*mlp\\.down_proj$"], "weights": {"num_bits": 8}}},
              "kv_cache": {"strategy": strategy}, "steps": [quantizer]}
    ckpt = quantkit.quantize(str(src), recipe, calibration=CALIB).save(tmp_path / "ckpt")
    tensors = _tensors(ckpt)
    ref = _post_rope_kv(src, CALIB)
    k0, v0 = ref[0]   # layer 0 sees only embeddings: exact; layer 1 sees the quantized down_proj
    for name, absmax in (("k_scale", k0), ("v_scale", v0)):
        want = absmax.amax().reshape(1) if strategy == "tensor" else absmax.reshape(-1, 1, 1)
        torch.testing.assert_close(tensors[f"model.layers.0.self_attn.{name}"], want / 448, rtol=1e-5, atol=0)
    for name, absmax in zip(("k_scale", "v_scale"), ref[1]):
        got = tensors[f"model.layers.1.self_attn.{name}"].flatten() * 448
        want = absmax.amax().reshape(1) if strategy == "tensor" else absmax
        torch.testing.assert_close(got, want, rtol=0.05, atol=0)


def test_mse_range_clips_a_lone_outlier_and_never_widens():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 2, 16, generator=g)
    x[3, 1, 5] = 40.0   # head 1: one outlier far out
    absmax = x.abs().amax(dim=(0, 2))
    got = mse_range(x, absmax, per_head=True)
    assert (got <= absmax).all() and (got >= 0.5 * absmax).all()

    def err(r):
        return (fake_quantize_fp8(x, (r / 448).reshape(1, -1, 1)) - x).pow(2).sum(dim=(0, 2))

    assert (err(got) <= err(absmax)).all()
    tensor = mse_range(x, absmax, per_head=False)
    assert tensor.unique().numel() == 1 and tensor[0] <= absmax.max()


def test_mse_observer_scales_within_the_minmax_ones(checkpoints, src, tmp_path):
    recipe = {"scheme": "FP8_DYNAMIC", "kv_cache": {"strategy": "attn_head", "observer": "mse"}}
    mse = _tensors(quantkit.quantize(str(src), recipe, calibration=CALIB).save(tmp_path / "mse"))
    minmax = _tensors(checkpoints["attn_head"])
    for k in (k for k in minmax if k.endswith(("k_scale", "v_scale"))):
        assert mse[k].shape == minmax[k].shape
        assert (mse[k] <= minmax[k]).all() and (mse[k] >= 0.5 * minmax[k] * (1 - 1e-6)).all()


# -- the quantized-KV attention -----------------------------------------------------------------------
def _plain_kv_reference(module, query, key, value, mask, scaling=None, **kw):
    """Quantize-dequantize K and V (E4M3 with the module's scales), then textbook attention."""
    def qdq(x, s):
        return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s

    key, value = qdq(key, module.k_scale), qdq(value, module.v_scale)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if mask is not None:
        scores = scores + mask[..., : key.shape[-2]]
    out = torch.softmax(scores.float(), -1).to(query.dtype) @ value
    return out.transpose(1, 2).contiguous(), None


@pytest.mark.parametrize("arch, kv_heads", [("LlamaForCausalLM", 2), ("Gemma3ForCausalLM", 1)])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kv_attention_equals_qdq_then_plain_attention(arch, kv_heads, strategy):
    """GQA (4 query heads on 2 or 1 KV heads); Gemma3's layer 0 attends through a sliding window
    of 6 over 24 positions, its mask made by transformers for each implementation."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, kv_heads=kv_heads), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    g = torch.Generator().manual_seed(1)
    shape = (1,) if strategy == "tensor" else (kv_heads, 1, 1)
    for layer in model.model.layers:   # coarse scales: K and V clip, so quantization shows
        for n in ("k_scale", "v_scale"):
            layer.self_attn.register_buffer(n, 0.002 * (1 + torch.rand(shape, generator=g)))
    ids = torch.randint(0, 128, (2, 24), generator=g)
    with torch.no_grad():
        plain = model(ids).logits
        assert use_kv_attention(model).startswith("quantkit_kv|")
        got = model(ids).logits
        AttentionInterface.register("test_plain_kv", _plain_kv_reference)
        AttentionMaskInterface.register("test_plain_kv", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
        model.set_attn_implementation("test_plain_kv")
        want = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (got - plain).abs().max() > 1e-2   # the KV error is there to be seen


def test_fake_quantize_is_e4m3_per_head():
    x = torch.randn(2, 3, 5, 8)
    s = torch.tensor([0.01, 0.02, 0.03]).reshape(3, 1, 1)
    q = fake_quantize_fp8(x, s)
    assert ((q / s).abs() <= 448).all()
    torch.testing.assert_close((q / s).to(torch.float8_e4m3fn).float(), q / s)   # on the E4M3 grid
    assert torch.equal(fake_quantize_fp8(q, s), q)   # the cache reread: idempotent


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_load_selects_kv_attention_from_the_checkpoint(checkpoints, src, strategy):
    ckpt = checkpoints[strategy]
    model = quantkit.load(ckpt)
    info = model.quantkit_info
    assert info["kv_cache"] == strategy and info["attention"].startswith("quantkit_kv|")
    attn = model.model.layers[1].self_attn
    assert torch.equal(attn.k_scale, _tensors(ckpt)["model.layers.1.self_attn.k_scale"])
    ids = torch.tensor(random_ids(1, 16, seed=3))
    with torch.no_grad():
        with_kv = model(ids).logits
        model.set_attn_implementation(info["attention"].split("|")[1])
        without = model(ids).logits
    assert torch.isfinite(with_kv).all() and not torch.equal(with_kv, without)
    assert quantkit.load(quantkit.quantize(str(src), "fp8-dynamic").save(src.parent / f"nokv-{strategy}")) \
        .quantkit_info["attention"] is None


def test_decoding_with_a_cache_equals_the_full_forward(checkpoints):
    """Past K and V come back from the cache and are rounded again: E4M3 with the same scale is
    idempotent, so one token decoded after a prefill sees what the full forward sees."""
    model = quantkit.load(checkpoints["attn_head"])
    ids = torch.tensor(random_ids(1, 14, seed=5))
    with torch.no_grad():
        full = model(ids).logits[0, -1]
        prefill = model(ids[:, :-1], use_cache=True)
        step = model(ids[:, -1:], cache=prefill.past_key_values, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


def test_loads_in_transformers_with_compressed_tensors(checkpoints):
    """transformers 5.24 + compressed-tensors 0.20.1 load the checkpoint (weights decompressed),
    but no attention module takes the scales: compressed-tensors finds attention modules by a
    ``past_key_values`` argument, which transformers 5 renamed ``cache``; k_scale / v_scale are
    reported UNEXPECTED and dropped, so the model runs with an unquantized KV cache."""
    import compressed_tensors  # noqa: F401  (a missing package fails here, not skips)
    from transformers import AutoModelForCausalLM

    for strategy, ckpt in checkpoints.items():
        model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
        with torch.no_grad():
            logits = model(torch.tensor(random_ids(1, 12, seed=4))).logits
        assert torch.isfinite(logits).all()
        assert not hasattr(model.model.layers[0].self_attn, "k_scale"), \
            "transformers now takes the KV scales: update this test, docs/DESIGN.md and README"


# -- the integrity pass ---------------------------------------------------------------------------
def test_integrity_names_a_zeroed_k_scale_and_nothing_on_a_clean_one(checkpoints, src, tmp_path):
    from quantkit.evaluation.integrity import check_checkpoint

    for ckpt in checkpoints.values():
        clean = check_checkpoint(src, ckpt)
        assert clean.tensors == {} and not any("scale" in n for n in clean.notes)
    key = "model.layers.1.self_attn.k_scale"
    bad_dir = tmp_path / "bad"
    shutil.copytree(checkpoints["attn_head"], bad_dir)
    shard = bad_dir / "model.safetensors"
    tensors = load_file(shard)
    tensors[key] = torch.zeros_like(tensors[key])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    bad = check_checkpoint(src, bad_dir)
    assert list(bad.tensors) == [key]
    assert bad.tensors[key]["problems"]
