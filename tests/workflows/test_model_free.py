"""Model-free conversion: the model path's bytes without a model, any architecture, bad input refused.

The model path is the reference: where both can run (a Llama transformers builds) every tensor of
every shard, the integrity rows and the ``quantization_config`` must be equal. A folder whose
``model_type`` transformers does not know converts too, and compressed-tensors' own decompressor
reads its weights back near the source.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.quantization import QuantizationScheme
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import quantkit
from quantkit.errors import QuantkitError
from quantkit.workflows.model_free import ModelFreeOptions, quantize_model_free

from inputs.quantized_sources import make_gpt_oss_dir, save_dequantized, save_fp8_block_source, save_mxfp4_source
from model_factory import make_llama_dir
from moe_models import MOE_ARCHS, make_moe_dir

torch.set_num_threads(1)

#: two config groups (the MLP in int4 groups, the rest in FP8) and a linear kept by its exact name
MIXED = {"version": 1, "ignore": ["lm_head", "model.layers.1.self_attn.o_proj"], "algorithm": {"name": "rtn"},
         "config_groups": {
             "mlp": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                            "strategy": "group", "group_size": 64}},
             "rest": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                                         "strategy": "channel"},
                      "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                            "dynamic": True}}}}
RECIPES = ["w8a16", "fp8-dynamic", "nvfp4a16", "w4a16-g64", "w4a16-asym", "fp8-block", "mxfp4a16", "mxfp8", "MXFP8A16",
           "w8a8", MIXED]


def tensors_of(folder: Path, sub: str = "") -> dict[str, tuple[str, torch.Tensor]]:
    """Every tensor of the folder's ``*.safetensors`` (``sub``: a sub-folder), with its file's name."""
    out = {}
    for f in sorted((folder / sub).glob("*.safetensors")):
        with safe_open(f, "pt") as h:
            out.update({k: (f.name, h.get_tensor(k)) for k in h.keys()})
    return out


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Same shard files, each tensor in the same file with the same dtype, shape and bytes; the
    same integrity rows; the same quantization_config."""
    for sub in ("", "integrity"):
        ta, tb = tensors_of(a, sub), tensors_of(b, sub)
        assert ta.keys() == tb.keys(), sorted(set(ta) ^ set(tb))[:5]
        for k, (fa, x) in ta.items():
            fb, y = tb[k]
            assert fa == fb, (k, fa, fb)
            assert x.dtype == y.dtype and x.shape == y.shape, k
            assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), k
    qa, qb = (json.loads((p / "config.json").read_text())["quantization_config"] for p in (a, b))
    assert qa == qb
    # the dtype transformers builds the model in (dtype="auto"): bfloat16 under the FP4/MX formats
    da, db = (json.loads((p / "config.json").read_text()).get("dtype") for p in (a, b))
    assert da == db


def folder_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    # widths 128 divides (FP8 blocks), k/v as wide as q (a 128-row block), untied head
    return make_llama_dir(tmp_path_factory.mktemp("mf") / "llama", hidden=128, intermediate=256, kv_heads=4,
                          tie=False)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r if isinstance(r, str) else "two-groups" for r in RECIPES])
def test_bit_identical_to_the_model_path(llama, tmp_path, recipe):
    a = quantkit.quantize(llama, recipe).save(tmp_path / "model-path")
    b = quantize_model_free(llama, recipe).save(tmp_path / "model-free")
    assert_same_checkpoint(a, b)
    mixed = recipe is MIXED
    kept = ["model.layers.1.self_attn.o_proj", "lm_head"] if mixed else ["lm_head"]
    assert json.loads((b / "config.json").read_text())["quantization_config"]["ignore"] == kept
    log = json.loads((b / "quantization_log.json").read_text())
    assert len(log["modules"]) == 14 - mixed and "model_free" in log
    assert (b / "README.md").exists() and (b / ".quantkit-output.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["w8a16", "fp8-dynamic", "nvfp4a16"])
def test_bit_identical_on_smollm2(smollm2_dir, tmp_path, recipe):
    """The embedded SmolLM2 (tied head, several shards: the embedding fills one of its own)."""
    a = quantkit.quantize(smollm2_dir, recipe).save(tmp_path / "model-path")
    b = quantize_model_free(smollm2_dir, recipe).save(tmp_path / "model-free")
    assert len(list(a.glob("*.safetensors"))) > 1
    assert_same_checkpoint(a, b)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_checkpoints_equal_the_model_path(tmp_path, arch):
    """Per-expert linears quantized, routers and Qwen2-MoE's shared-expert gate kept and named in
    ``ignore`` (the model path lists them in module order, this path in checkpoint order)."""
    src = make_moe_dir(tmp_path / "src", arch)
    a = quantkit.quantize(src, "w8a16").save(tmp_path / "model-path")
    b = quantize_model_free(src, "w8a16").save(tmp_path / "model-free")
    qa, qb = (json.loads((p / "config.json").read_text())["quantization_config"] for p in (a, b))
    assert sorted(qa.pop("ignore")) == sorted(qb["ignore"])
    for p in (a, b):   # everything else, every tensor included, equal
        config = json.loads((p / "config.json").read_text())
        config["quantization_config"] = qa
        (p / "config.json").write_text(json.dumps(config))
    assert_same_checkpoint(a, b)


def test_nvfp4_experts_each_share_their_own_global_scale(tmp_path):
    """gate/up of one expert share a scale (vLLM fuses them into w13), each expert its own, and a
    down projection keeps its own; the model path shares one across a layer's experts instead.
    DeepSeek's MLA q_a_proj and kv_a_proj_with_mqa (vLLM's fused_qkv_a_proj) share theirs."""
    src = make_moe_dir(tmp_path / "src", "Qwen3MoeForCausalLM")
    t = load_file(str(quantize_model_free(src, "nvfp4a16").save(tmp_path / "out") / "model.safetensors"))
    p = "model.layers.0.mlp.experts."
    scales = [t[f"{p}{e}.gate_proj.weight_global_scale"] for e in range(4)]
    assert all(torch.equal(scales[e], t[f"{p}{e}.up_proj.weight_global_scale"]) for e in range(4))
    assert len({float(s) for s in scales}) == 4
    assert not torch.equal(t[f"{p}0.down_proj.weight_global_scale"], t[f"{p}1.down_proj.weight_global_scale"])
    mla = tmp_path / "mla"
    mla.mkdir()
    g = torch.Generator().manual_seed(1)
    a = "model.layers.0.self_attn."
    save_file({a + "q_a_proj.weight": torch.randn(32, 64, generator=g), a + "o_proj.weight": torch.randn(64, 64, generator=g),
               a + "kv_a_proj_with_mqa.weight": torch.randn(48, 64, generator=g) * 3}, str(mla / "model.safetensors"))
    (mla / "config.json").write_text(json.dumps({"model_type": "zorblax"}))
    t = load_file(str(quantize_model_free(mla, "nvfp4a16").save(tmp_path / "mla-out") / "model.safetensors"))
    assert torch.equal(t[a + "q_a_proj.weight_global_scale"], t[a + "kv_a_proj_with_mqa.weight_global_scale"])
    assert not torch.equal(t[a + "q_a_proj.weight_global_scale"], t[a + "o_proj.weight_global_scale"])


def test_a_bfloat16_checkpoint_equals_the_model_path(llama, tmp_path):
    src = tmp_path / "bf16"
    src.mkdir()
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(llama / "model.safetensors")).items()},
              str(src / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((llama / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}))
    for recipe in ("nvfp4a16", "w4a16-g64"):
        a = quantkit.quantize(src, recipe).save(tmp_path / f"model-path-{recipe}")
        b = quantize_model_free(src, recipe).save(tmp_path / f"model-free-{recipe}")
        assert_same_checkpoint(a, b)


def test_an_fp8_block_source_converts_as_the_model_path_converts_it(tmp_path):
    """A DeepSeek-style FP8 source (block scales, partial edge blocks) is read dequantized, as the
    model path reads it: the same bytes as the model path, and as its plain float copy; a source
    whose quantized experts are fused 3-D tensors (gpt-oss) is refused in one line."""
    float_dir = make_llama_dir(tmp_path / "float", hidden=320, intermediate=448, heads=5, kv_heads=1, vocab=260)
    source = save_fp8_block_source(float_dir, tmp_path / "fp8")
    plain = save_dequantized(source, tmp_path / "dequantized")
    a = quantkit.quantize(source, "nvfp4a16").save(tmp_path / "model-path")
    b = quantize_model_free(source, "nvfp4a16").save(tmp_path / "model-free")
    c = quantize_model_free(plain, "nvfp4a16").save(tmp_path / "model-free-plain")
    assert_same_checkpoint(a, b)
    assert_same_checkpoint(b, c)
    assert not any(k.endswith("_scale_inv") for k in tensors_of(b))
    gpt_oss = save_mxfp4_source(make_gpt_oss_dir(tmp_path / "gpt-oss"), tmp_path / "mxfp4")
    with pytest.raises(QuantkitError, match="fused experts"):
        quantize_model_free(gpt_oss, "w8a16")


# -- an architecture transformers does not know --------------------------------------------------
def make_unknown_dir(path: Path, layers: int = 2, hidden: int = 64, experts: int = 2) -> Path:
    """A checkpoint of a made-up MoE family: fused qkv, a router, experts named w1/w2/w3, norms
    with odd names, a vision tower, an untied head; a tokenizer file that must travel."""
    g = torch.Generator().manual_seed(0)
    t = {"model.embed_tokens.weight": (256, hidden), "lm_head.weight": (256, hidden), "model.final_norm.weight": (hidden,),
         "model.vision_tower.layers.0.fc.weight": (hidden, hidden), "model.vision_tower.layers.0.fc.bias": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "ln_attn.weight": (hidden,), p + "attn.qkv.weight": (3 * hidden, hidden),
                  p + "attn.qkv.bias": (3 * hidden,), p + "attn.out.weight": (hidden, hidden),
                  p + "ffn_norm.weight": (hidden,), p + "moe.router.weight": (experts, hidden),
                  p + "moe.rope_table": (4, 8, 2)})
        for e in range(experts):
            t.update({f"{p}moe.experts.{e}.w1.weight": (2 * hidden, hidden), f"{p}moe.experts.{e}.w3.weight": (2 * hidden, hidden),
                      f"{p}moe.experts.{e}.w2.weight": (hidden, 2 * hidden)})
    tensors = {k: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.05) for k, s in t.items()}
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "zorblax", "architectures": ["ZorblaxForCausalLM"],
                                                  "hidden_size": hidden, "torch_dtype": "float32"}))
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return path


def decoded(path: Path, module: str) -> torch.Tensor:
    """``module``'s weight as compressed-tensors' decompressor reads it from the checkpoint."""
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    state = load_file(str(path / "model.safetensors"))
    scheme = QuantizationScheme.model_validate(qc["config_groups"]["group_0"])
    tensors = {k.removeprefix(module + "."): v for k, v in state.items() if k.startswith(module + ".")}
    return BaseCompressor.get_value_from_registry(qc["format"]).decompress(tensors, scheme)["weight"].float()


@pytest.mark.parametrize("recipe,limit", [("w8a16", 0.01), ("nvfp4a16", 0.15), ("fp8-dynamic", 0.05)])
def test_unknown_architecture_reads_back_near_the_source(tmp_path, recipe, limit):
    src = make_unknown_dir(tmp_path / "zorblax")
    before = folder_digest(src)
    out = quantize_model_free(src, recipe).save(tmp_path / "out")
    source = load_file(str(src / "model.safetensors"))
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    log = json.loads((out / "quantization_log.json").read_text())
    targets = sorted(log["modules"])
    assert len(targets) == 2 * (2 + 3 * 2)   # per layer: qkv, out, three linears of two experts
    assert not any("router" in m or "vision" in m or "norm" in m for m in targets)
    assert set(qc["ignore"]) == {"lm_head", "model.layers.0.moe.router", "model.layers.1.moe.router",
                                 "model.vision_tower.layers.0.fc"}
    written = load_file(str(out / "model.safetensors"))
    for k in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.moe.rope_table",
              "model.layers.0.attn.qkv.bias", "model.layers.0.moe.router.weight"):
        assert torch.equal(written[k], source[k]), k
    for m in targets:
        w = source[m + ".weight"]
        assert float((decoded(out, m) - w).norm() / w.norm()) < limit, m
    assert (out / "tokenizer.json").exists()
    assert folder_digest(src) == before


def test_a_target_rule_of_ones_own(tmp_path):
    src = make_unknown_dir(tmp_path / "zorblax")
    out = quantize_model_free(src, "w8a16", ModelFreeOptions(targets=r".*\.attn\.")).save(tmp_path / "out")
    log = json.loads((out / "quantization_log.json").read_text())
    assert sorted(log["modules"]) == [f"model.layers.{i}.attn.{n}" for i in range(2) for n in ("out", "qkv")]
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.0.moe.experts.1.w2" in ignore   # every linear left unquantized is named


def test_nvfp4_siblings_share_one_global_scale(llama, tmp_path):
    out = quantize_model_free(llama, "nvfp4a16").save(tmp_path / "out")
    t = load_file(str(out / "model.safetensors"))
    p = "model.layers.0."
    qkv = [t[f"{p}self_attn.{n}_proj.weight_global_scale"] for n in "qkv"]
    assert torch.equal(qkv[0], qkv[1]) and torch.equal(qkv[0], qkv[2])
    assert torch.equal(t[f"{p}mlp.gate_proj.weight_global_scale"], t[f"{p}mlp.up_proj.weight_global_scale"])
    assert not torch.equal(t[f"{p}self_attn.o_proj.weight_global_scale"], qkv[0])


# -- bad input ----------------------------------------------------------------------------------
def run_cli(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "quantkit.cli", "convert", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


def assert_refused(res, needle: str, out: Path) -> None:
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".quantkit-tmp")]


@pytest.mark.parametrize("args,needle", [
    (["--model-free", "-r", "w4a16-g64-gptq"], "steps[0]: 'gptq'"),
    (["--model-free", "-r", "w8a8-smoothquant"], "steps[0]: 'smoothquant'"),
    (["--model-free", "-r", "w4a16-g64-gptq-rot"], "'rotate'"),
    (["--model-free", "-r", "fp8"], "input_activations"),
    (["--model-free", "-r", "fp8-dynamic-kv-fp8"], "kv_cache"),
    (["--targets", "(", "-r", "w8a16"], "--targets"),
    (["--targets", "nothing", "-r", "w8a16"], "--targets"),
    (["--model-free", "--resume", "-r", "w8a16"], "--resume"),
    (["--model-free", "--ignore", "re:.*nothing.*", "-r", "w8a16"], "--ignore"),
])
def test_bad_input_is_one_line(tmp_path, args, needle):
    src = make_unknown_dir(tmp_path / "zorblax")
    before = folder_digest(src)
    out = tmp_path / "out"
    assert_refused(run_cli(src, "-o", out, "--no-eval", *args), needle, out)
    assert not out.exists() and folder_digest(src) == before


def test_bad_weights_and_folders_are_one_line(tmp_path):
    """A NaN met in the last layer (the first one already written), a group size the widths refuse, a source
    already quantized: one line each, no staging folder or output left."""
    src = make_unknown_dir(tmp_path / "zorblax")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.1.moe.experts.1.w2.weight"][3, 5] = float("nan")
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    assert_refused(run_cli(src, "--model-free", "-r", "w8a16", "-o", out), "model.layers.1.moe.experts.1.w2.weight", out)
    assert_refused(run_cli(src, "--model-free", "-r", "w4a16", "-o", out), "group_size 128", out)
    done = quantize_model_free(make_unknown_dir(tmp_path / "clean"), "w8a16").save(tmp_path / "done")
    assert_refused(run_cli(done, "--model-free", "-r", "w8a16", "-o", out), "already quantized", out)
    assert not out.exists()


def test_cli_takes_the_model_free_path_for_an_unknown_folder(tmp_path):
    src = make_unknown_dir(tmp_path / "zorblax")
    out = tmp_path / "out"
    res = run_cli(src, "-r", "w8a16", "-o", out)
    assert res.returncode == 0, res.stderr
    assert "model-free: " in res.stderr and "evaluation skipped" in res.stderr
    # the output exists: refused without --overwrite, replaced with it, as the model path does
    assert_refused(run_cli(src, "-r", "w8a16", "-o", out), "--overwrite", out)
    res = run_cli(src, "-r", "fp8-dynamic", "-o", out, "--overwrite", "--no-eval")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "float-quantized"
    # a data-driven recipe is the model path's to refuse: transformers cannot build the folder
    assert_refused(run_cli(src, "-r", "w4a16-g64-gptq", "-o", tmp_path / "out2"), "config.json", tmp_path / "out2")


def test_killed_and_interrupted_runs_leave_nothing_behind(tmp_path, monkeypatch):
    """SIGTERM after a layer: exit 143, no staging folder, no output. SIGKILL: the staging folder
    stays (nothing can clean up), and the next run of the same output removes it."""
    src = make_unknown_dir(tmp_path / "zorblax")
    out = tmp_path / "out"

    def staged() -> list[Path]:
        return [p for p in tmp_path.iterdir() if p.name.startswith(".quantkit-tmp")]

    monkeypatch.setenv("QUANTKIT_TEST_KILL_AT", "layer:1")
    monkeypatch.setenv("QUANTKIT_TEST_KILL_SIGNAL", "TERM")
    res = run_cli(src, "--model-free", "-r", "w8a16", "-o", out, "--no-eval")
    assert res.returncode == 143 and "interrupted" in res.stderr, res.stderr
    assert not staged() and not out.exists()
    monkeypatch.setenv("QUANTKIT_TEST_KILL_SIGNAL", "KILL")
    assert run_cli(src, "--model-free", "-r", "w8a16", "-o", out, "--no-eval").returncode == -9
    assert len(staged()) == 1 and not out.exists()
    monkeypatch.delenv("QUANTKIT_TEST_KILL_AT")
    res = run_cli(src, "--model-free", "-r", "w8a16", "-o", out, "--no-eval")
    assert res.returncode == 0 and "staging folder of a killed run" in res.stderr, res.stderr
    assert not staged() and (out / "model.safetensors").exists()


def test_a_users_folder_is_never_replaced(tmp_path):
    src = make_unknown_dir(tmp_path / "zorblax")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    assert_refused(run_cli(src, "--model-free", "-r", "w8a16", "-o", out, "--overwrite"), "--out", out)
    assert (out / "notes.txt").read_text() == "keep"
    assert_refused(run_cli(src, "--model-free", "-r", "w8a16", "-o", src / "q", "--overwrite"), "--out", src)


def test_api_refuses_a_data_driven_recipe_and_a_model_in_memory(llama):
    with pytest.raises(QuantkitError, match=r"steps\[0\]: 'gptq'"):
        quantkit.quantize_model_free(llama, "w4a16-g64-gptq")
    # an observer that weighs columns by their inputs needs data too: refused, not run as plain MSE
    weighted = {"version": 1, "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
        "observer": "imatrix_mse"}}}, "ignore": ["lm_head"]}
    with pytest.raises(QuantkitError, match=r"config_groups\.g\.weights\.observer: imatrix_mse"):
        quantkit.quantize_model_free(llama, weighted)
    with pytest.raises(QuantkitError, match="not a Linear"):
        quantkit.quantize_model_free(torch.nn.Linear(4, 4), "w8a16")
    with pytest.raises(QuantkitError, match="--targets"):
        quantkit.ModelFreeOptions(targets="re:.*proj")
