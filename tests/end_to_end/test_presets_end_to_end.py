"""End to end on a tiny random Llama: every preset converts, loads and computes what it should."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import quantkit
from quantkit.formats.compressed_tensors import decompress_module
from quantkit.runtime.modules import QuantLinear
from quantkit.numerics.primitives import fake_quantize, quantize_weight

from model_factory import make_llama_dir, random_ids

PRESET_RECIPES = {
    "W4A16": {"scheme": "W4A16", "group_size": 32},
    "W4A16_ASYM": {"scheme": "W4A16_ASYM", "group_size": 32},
    "W8A16": {"scheme": "W8A16"},
    "W8A8": {"scheme": "W8A8"},
    "FP8": {"scheme": "FP8"},
    "FP8_DYNAMIC": {"scheme": "FP8_DYNAMIC"},
}


@pytest.fixture(scope="module")
def converted(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for name, rec in PRESET_RECIPES.items():
        q = quantkit.quantize(tiny_llama, rec, calibration=random_ids(4, 32))
        out[name] = q.save(root / name)
    return out


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _fake_quant_reference(src, scheme_name):
    """The fp32 model with every decoder linear's weight fake-quantized by RTN."""
    model = AutoModelForCausalLM.from_pretrained(src)
    args = quantkit.load_recipe(PRESET_RECIPES[scheme_name]).groups["group_0"].weights
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and ".layers." in name:
                q, s, z = quantize_weight(m.weight, args)
                m.weight.copy_(fake_quantize(m.weight, s, z, args))
    return model


@pytest.mark.parametrize("name", ["W4A16", "W4A16_ASYM", "W8A16"])
def test_weight_only_matches_fake_quant_reference(converted, tiny_llama, name):
    ids = random_ids(2, 16, seed=5)
    got = _logits(quantkit.load(converted[name]), ids)
    want = _logits(_fake_quant_reference(tiny_llama, name), ids)
    assert _rel(got, want) < 1e-5


@pytest.mark.parametrize("name,limit", [("W4A16", 0.5), ("W4A16_ASYM", 0.5), ("W8A16", 0.05),
                                        ("W8A8", 0.06), ("FP8", 0.2), ("FP8_DYNAMIC", 0.2)])
def test_close_to_fp32_and_smaller(converted, tiny_llama, name, limit):
    ids = random_ids(2, 16, seed=6)
    ref = _logits(AutoModelForCausalLM.from_pretrained(tiny_llama), ids)
    model = quantkit.load(converted[name])
    got = _logits(model, ids)
    assert _rel(got, ref) < limit
    n_quant = sum(isinstance(m, QuantLinear) for m in model.modules())
    assert n_quant == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down); lm_head kept
    assert not isinstance(model.lm_head, QuantLinear)


@pytest.mark.parametrize("name", ["W4A16", "W8A16", "FP8", "FP8_DYNAMIC"])
def test_transformers_compressed_tensors_agree(converted, name):
    import compressed_tensors  # noqa: F401
    ids = random_ids(1, 12, seed=7)
    ours = _logits(quantkit.load(converted[name]), ids)
    theirs = _logits(AutoModelForCausalLM.from_pretrained(converted[name]), ids)
    assert _rel(ours, theirs) < 1e-3


def test_checkpoint_metadata(converted):
    cfg = json.loads((converted["W4A16"] / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["quantization_status"] == "compressed" and "lm_head" in qc["ignore"]
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["group_size"], w["strategy"], w["symmetric"]) == (4, 32, "group", True)
    fmts = {n: json.loads((p / "config.json").read_text())["quantization_config"]["format"] for n, p in converted.items()}
    assert fmts == {"W4A16": "pack-quantized", "W4A16_ASYM": "pack-quantized", "W8A16": "pack-quantized",
                    "W8A8": "int-quantized", "FP8": "float-quantized", "FP8_DYNAMIC": "float-quantized"}
    log = json.loads((converted["W4A16"] / "quantization_log.json").read_text())
    assert len(log["modules"]) == 14 and all(m["sqnr_db"] > 10 for m in log["modules"].values())


def test_static_fp8_stores_calibrated_input_scales(converted):
    from safetensors import safe_open

    with safe_open(converted["FP8"] / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        s = f.get_tensor("model.layers.0.mlp.down_proj.input_scale")
        w = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert w.dtype == torch.float8_e4m3fn and s.numel() == 1 and float(s) > 0
    assert all(f"model.layers.{i}.self_attn.{p}_proj.input_scale" in keys for i in (0, 1) for p in "qkvo")


def test_decoded_weights_equal_compressed_tensors(converted):
    """compressed-tensors' own decompressor gives exactly quantkit's dequantized weights."""
    import compressed_tensors.compressors.pack_quantized.base as ct
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors import safe_open

    for name in ("W4A16", "W4A16_ASYM", "W8A16"):
        path = converted[name]
        qc = json.loads((path / "config.json").read_text())["quantization_config"]
        scheme_ct = QuantizationScheme.model_validate(qc["config_groups"]["group_0"])
        scheme = quantkit.load_recipe(PRESET_RECIPES[name]).groups["group_0"]
        prefix = "model.layers.1.mlp.down_proj."
        with safe_open(path / "model.safetensors", "pt") as f:
            sd = {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        theirs = ct.PackedQuantizationCompressor.decompress(sd, scheme_ct)["weight"]
        assert torch.equal(decompress_module(sd, scheme), theirs), name


def test_ignore_keeps_modules_in_high_precision(tiny_llama, tmp_path):
    rec = {"scheme": "W8A16", "ignore": ["re:.*mlp.down_proj", "model.layers.0.self_attn.q_proj"]}
    path = quantkit.quantize(tiny_llama, rec).save(tmp_path / "mixed")
    model = quantkit.load(path)
    assert not isinstance(model.model.layers[0].mlp.down_proj, QuantLinear)
    assert not isinstance(model.model.layers[0].self_attn.q_proj, QuantLinear)
    assert isinstance(model.model.layers[1].self_attn.q_proj, QuantLinear)
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama)
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, ref.model.layers[1].mlp.down_proj.weight)


def test_mixed_precision_groups(tiny_llama, tmp_path):
    rec = {"config_groups": {
        "attn": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "strategy": "channel"}},
        "mlp": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "group_size": 32}},
    }}
    path = quantkit.quantize(tiny_llama, rec).save(tmp_path / "mp")
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "pack-quantized"  # both weight-only int: one format
    model = quantkit.load(path)
    assert model.model.layers[0].self_attn.q_proj.num_bits == 8
    assert model.model.layers[0].mlp.up_proj.num_bits == 4
    rec["config_groups"]["attn"] = {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                    "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}
    path = quantkit.quantize(tiny_llama, rec).save(tmp_path / "mp2")
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision"
    ids = random_ids(1, 10, seed=9)
    ref = _logits(AutoModelForCausalLM.from_pretrained(tiny_llama), ids)
    assert _rel(_logits(quantkit.load(path), ids), ref) < 0.5


def test_sharding_and_in_memory_model(tiny_llama, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    rec = {"scheme": "W8A16", "output": {"max_shard_size": "60KB"}}
    path = quantkit.quantize(model, rec).save(tmp_path / "sharded")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and all((path / s).exists() for s in shards)
    ids = random_ids(1, 10, seed=3)
    assert _rel(_logits(quantkit.load(path), ids), _logits(model, ids)) < 0.05


def test_model_built_in_memory_takes_nothing_from_the_working_directory(tmp_path, monkeypatch):
    """A model built in memory names no folder: the working directory's files (a tokenizer, a link
    out of it) are neither copied into its checkpoint nor checked as the model's."""
    from transformers import LlamaConfig

    work = tmp_path / "work"
    work.mkdir()
    (work / "tokenizer_config.json").write_text("{}")
    (work / "outside").symlink_to(tmp_path)
    monkeypatch.chdir(work)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    path = quantkit.quantize(AutoModelForCausalLM.from_config(cfg), {"scheme": "W8A16"}).save(tmp_path / "mem")
    assert not (path / "tokenizer_config.json").exists()


def test_qwen2_with_biases(tmp_path):
    src = make_llama_dir(tmp_path / "qwen", arch="qwen2")
    path = quantkit.quantize(src, {"scheme": "W8A8"}).save(tmp_path / "q")
    model = quantkit.load(path)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    ids = random_ids(1, 10, seed=4)
    ref = AutoModelForCausalLM.from_pretrained(src)
    assert _rel(_logits(model, ids), _logits(ref, ids)) < 0.06


def test_model_built_in_memory(tmp_path):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(cfg)  # config.architectures is empty
    path = quantkit.quantize(model, {"scheme": "W8A16"}).save(tmp_path / "mem")
    ids = random_ids(1, 8, vocab=128)
    assert _rel(_logits(quantkit.load(path), ids), _logits(model, ids)) < 0.05


# -- packed calibration: several samples per row, padding at row ends ------------------------
def _varied_samples():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (40, 9, 23, 31, 14, 40, 6, 17)]


def _tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_static_input_scales_ignore_padding(tiny_llama, tmp_path, monkeypatch):
    """Padding tokens run through the model too: they must not move a static scale."""
    import dataclasses

    from quantkit.arch import table as arch

    samples = _varied_samples()
    packed = _tensors(quantkit.quantize(tiny_llama, {"scheme": "FP8"}, calibration=samples).save(tmp_path / "p"))
    spec = arch.ARCHITECTURES["LlamaForCausalLM"]
    monkeypatch.setitem(arch.ARCHITECTURES, "LlamaForCausalLM", dataclasses.replace(spec, packed_calibration=False))
    alone = _tensors(quantkit.quantize(tiny_llama, {"scheme": "FP8"}, calibration=samples).save(tmp_path / "a"))
    scales = [k for k in packed if k.endswith("input_scale")]
    assert len(scales) == 14
    for k in scales:
        torch.testing.assert_close(packed[k], alone[k], rtol=1e-5, atol=0)


def test_gptq_one_pass_and_batched_reruns_agree(tiny_llama, tmp_path):
    """One call per layer (solve in the hooks) against one row per call (re-run per sub-group)."""
    samples = _varied_samples()
    recipe = {"scheme": "W4A16", "group_size": 32, "algorithm": {"name": "gptq", "true_sequential": True}}
    one = quantkit.quantize(tiny_llama, recipe, calibration=samples)
    rows = quantkit.quantize(tiny_llama, {**recipe, "calibration": {"batch_tokens": 40}}, calibration=samples)
    a, b = _tensors(one.save(tmp_path / "one")), _tensors(rows.save(tmp_path / "rows"))
    log_a = json.loads((tmp_path / "one" / "quantization_log.json").read_text())["modules"]
    log_b = json.loads((tmp_path / "rows" / "quantization_log.json").read_text())["modules"]
    for name, st in log_a.items():
        # the Hessians saw the samples' tokens, not the padding
        assert st["tokens"] == log_b[name]["tokens"] == sum(map(len, samples)), name
    # same objective up to summation order; a flipped code feeds every later column and layer
    total = [sum(log[n]["loss"] / log[n]["rtn_loss"] for n in log) for log in (log_a, log_b)]
    assert total[0] == pytest.approx(total[1], rel=0.02)
    from quantkit.formats.packing import unpack_int32

    packed = [k for k in a if k.endswith("weight_packed")]
    assert len(packed) == 14
    codes = {k: [unpack_int32(t[k], 4, tuple(t[k.replace("packed", "shape")].tolist())) for t in (a, b)] for k in packed}
    differ = sum(int((x != y).sum()) for x, y in codes.values()) / sum(x.numel() for x, _ in codes.values())
    assert differ < 0.1
    ids = random_ids(2, 24, seed=9)
    m1, m2, ref = quantkit.load(tmp_path / "one"), quantkit.load(tmp_path / "rows"), AutoModelForCausalLM.from_pretrained(tiny_llama)
    l1, l2, l0 = _logits(m1, ids), _logits(m2, ids), _logits(ref, ids)
    assert _rel(l1, l2) < 0.5 * _rel(l2, l0)  # two near-equal solutions, not two models


def test_gptq_batches_in_lockstep_match_one_batch(tiny_llama, tmp_path, monkeypatch):
    """One pass in several calibration batches (paused at each linear) against one batch."""
    from quantkit.pipeline import batches as pipeline
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    samples = _varied_samples()
    recipe = {"scheme": "W4A16", "group_size": 32, "algorithm": {"name": "gptq", "true_sequential": True}}
    one = quantkit.quantize(tiny_llama, recipe, calibration=samples)
    monkeypatch.setattr(pipeline, "MICRO_BATCH_TOKENS", 40)  # rows of 40 positions: one row per batch
    calls, lines = [], []
    forward = LlamaDecoderLayer.forward
    monkeypatch.setattr(LlamaDecoderLayer, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    many = quantkit.quantize(tiny_llama, recipe, samples, quantkit.ConvertOptions(log=lines.append))
    assert any("in 5 rows, 5 batches per layer, all in one pass" in line for line in lines), lines
    layers = AutoConfig.from_pretrained(tiny_llama).num_hidden_layers
    assert len(calls) == 5 * layers  # one call per batch and layer: no re-runs
    a, b = _tensors(one.save(tmp_path / "one")), _tensors(many.save(tmp_path / "many"))
    log_a = json.loads((tmp_path / "one" / "quantization_log.json").read_text())["modules"]
    log_b = json.loads((tmp_path / "many" / "quantization_log.json").read_text())["modules"]
    for name, st in log_a.items():
        assert st["tokens"] == log_b[name]["tokens"] == sum(map(len, samples)), name
        assert st["hessian_shared_with"] == log_b[name]["hessian_shared_with"], name
        # the same Hessians up to summation order; a flipped code feeds every later column
        assert st["loss"] == pytest.approx(log_b[name]["loss"], rel=0.1), name
    total = [sum(log[n]["loss"] / log[n]["rtn_loss"] for n in log) for log in (log_a, log_b)]
    assert total[0] == pytest.approx(total[1], rel=0.01)
    from quantkit.formats.packing import unpack_int32

    packed = [k for k in a if k.endswith("weight_packed")]
    codes = [(unpack_int32(a[k], 4, tuple(a[k.replace("packed", "shape")].tolist())),
              unpack_int32(b[k], 4, tuple(b[k.replace("packed", "shape")].tolist()))) for k in packed]
    differ = sum(int((x != y).sum()) for x, y in codes) / sum(x.numel() for x, _ in codes)
    assert differ < 0.1  # measured 1-6%, depending on the thread count
    ids = random_ids(2, 24, seed=9)
    m1, m2, ref = quantkit.load(tmp_path / "one"), quantkit.load(tmp_path / "many"), AutoModelForCausalLM.from_pretrained(tiny_llama)
    l1, l2, l0 = _logits(m1, ids), _logits(m2, ids), _logits(ref, ids)
    assert _rel(l1, l2) < 0.5 * _rel(l2, l0)  # two near-equal solutions, not two models


def test_offloaded_lockstep_parks_paused_batches_and_gives_the_same_checkpoint(tiny_llama, tmp_path, monkeypatch):
    """With the activations offloaded, a batch paused in the lockstep pass has its linear's
    input and its layer input in a file until it resumes: the checkpoint is the in-memory one."""
    from quantkit.pipeline import batches as pipeline
    from quantkit.pipeline import park as park_mod
    from quantkit.pipeline import passes

    samples = _varied_samples()
    recipe = {"scheme": "W4A16", "group_size": 32, "algorithm": {"name": "gptq", "true_sequential": True}}
    monkeypatch.setattr(pipeline, "MICRO_BATCH_TOKENS", 40)   # 5 batches in lockstep
    monkeypatch.setattr(park_mod, "MIN_PARK_BYTES", 1)        # the tiny model's tensors are small
    mem = quantkit.quantize(tiny_llama, recipe, calibration=samples)
    emptied, files = [], set()
    real = passes.park_tensors

    def counting(tensors, path):
        restore = real(tensors, path)
        files.add(path.name)
        emptied.append(sum(t is not None and t.untyped_storage().nbytes() == 0 for t in tensors))
        return restore

    monkeypatch.setattr(passes, "park_tensors", counting)
    recipe["calibration"] = {"offload": True}
    disk = quantkit.quantize(tiny_llama, recipe, samples, quantkit.ConvertOptions(workdir=tmp_path / "work"))
    layers = AutoConfig.from_pretrained(tiny_llama).num_hidden_layers
    # q, o, gate and down wait for every batch (k/v/up confirm the stacked solve without a wait)
    assert len(emptied) == 4 * 5 * layers
    assert all(n == 2 for n in emptied)   # the linear's input and the layer's input, both parked
    assert files == {f"parked-{j:06d}.bin" for j in range(5)}
    a, b = _tensors(mem.save(tmp_path / "mem")), _tensors(disk.save(tmp_path / "disk"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_offloaded_activations_give_the_same_checkpoint(tiny_llama, tmp_path):
    samples = _varied_samples()
    recipe = {"scheme": "W4A16", "group_size": 32, "algorithm": {"name": "gptq"},
              "calibration": {"batch_tokens": 80}}
    mem = quantkit.quantize(tiny_llama, recipe, calibration=samples)
    recipe["calibration"]["offload"] = True
    disk = quantkit.quantize(tiny_llama, recipe, samples, quantkit.ConvertOptions(workdir=tmp_path / "work"))
    a, b = _tensors(mem.save(tmp_path / "mem")), _tensors(disk.save(tmp_path / "disk"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the activation files are gone, and never were in the checkpoint
    assert not list((tmp_path / "work").glob(".quantkit-activations-*"))
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == sorted(p.name for p in (tmp_path / "mem").iterdir())


def test_offload_must_be_a_boolean(tiny_llama):
    with pytest.raises(quantkit.QuantkitError, match="calibration.offload"):
        quantkit.quantize(tiny_llama, {"scheme": "W4A16", "group_size": 32, "algorithm": {"name": "gptq"},
                                       "calibration": {"offload": "yes"}}, calibration=_varied_samples())
