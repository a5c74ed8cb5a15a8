"""MoE models (Qwen3-MoE, Mixtral): every expert quantized, written per expert, read back by
transformers + compressed-tensors; the all-experts calibration mode and the coverage table."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.errors import QuantkitError
from quantkit.arch.experts import UnfusedExperts, per_expert_state, unfuse_model
from quantkit.formats.compressed_tensors import decompress_module, parse_quantization_config
from quantkit.pipeline.coverage import Routing

from model_factory import random_ids
from moe_models import MOE_ARCHS, NUM_EXPERTS, make_moe_dir
from reference_reader import relative_logit_error

RECIPES = {
    "w4a16-rtn": {"scheme": "W4A16", "group_size": 32},
    "w4a16-gptq": {"scheme": "W4A16", "group_size": 32, "algorithm": "gptq"},
    "w8a8-rtn": {"scheme": "W8A8"},
    "w8a8-gptq": {"scheme": "W8A8", "algorithm": "gptq"},
    "fp8-dynamic": {"scheme": "FP8_DYNAMIC"},
}
# the experts' prefix within a layer and their gate, up, down linears, as checkpoints name them
LAYOUT = {"Qwen3MoeForCausalLM": ("mlp", ("gate_proj", "up_proj", "down_proj")),
          "MixtralForCausalLM": ("block_sparse_moe", ("w1", "w3", "w2")),
          "Qwen2MoeForCausalLM": ("mlp", ("gate_proj", "up_proj", "down_proj"))}
# quantized linears per layer: attention, the routed experts, Qwen2-MoE's shared expert
LINEARS = {arch: 4 + 3 * NUM_EXPERTS + 3 * (arch == "Qwen2MoeForCausalLM") for arch in LAYOUT}
CALIB = random_ids(4, 32)


@pytest.fixture(scope="module", params=MOE_ARCHS)
def moe(request, tmp_path_factory):
    """(arch, source folder, {recipe: checkpoint folder}) for one architecture."""
    root = tmp_path_factory.mktemp(request.param)
    src = make_moe_dir(root / "src", request.param)
    out = {name: quantkit.quantize(src, rec, calibration=CALIB).save(root / name) for name, rec in RECIPES.items()}
    return request.param, src, out


def _tensors(path):
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _config(path):
    return json.loads((path / "config.json").read_text())


def test_unfused_experts_compute_what_the_fused_module_does(tmp_path):
    for arch in MOE_ARCHS:
        src = make_moe_dir(tmp_path / arch, arch)
        fused = AutoModelForCausalLM.from_pretrained(src).eval()
        unfused = AutoModelForCausalLM.from_pretrained(src).eval()
        assert unfuse_model(unfused, unfused.config) == 2
        ids = torch.tensor(random_ids(2, 16, seed=4))
        with torch.no_grad():
            want = fused(ids).logits
            got = unfused(ids).logits
            # every token through every expert for statistics: the output is still the top-k sum
            for m in unfused.modules():
                if isinstance(m, UnfusedExperts):
                    m.routing = Routing(len(m), True, lambda: None, lambda: 0, torch.no_grad)
            all_experts = unfused(ids).logits
        assert float((got - want).norm() / want.norm()) < 1e-5, arch
        assert float((all_experts - want).norm() / want.norm()) < 1e-5, arch
        # the checkpoint's names: one module per expert linear, routers as they were
        names = dict(unfused.named_modules())
        block, (gate, up, down) = LAYOUT[arch]
        for e in range(NUM_EXPERTS):
            assert isinstance(names[f"model.layers.1.{block}.experts.{e}.{down}"], torch.nn.Linear)
        sd = unfused.state_dict()
        assert torch.equal(sd[f"model.layers.0.{block}.gate.weight"], fused.state_dict()["model.layers.0.mlp.gate.weight"])
        assert torch.equal(sd[f"model.layers.0.{block}.experts.2.{up}.weight"],
                           fused.model.layers[0].mlp.experts.gate_up_proj[2, 64:])


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_expert_quantized_per_expert(moe, recipe):
    arch, src, out = moe
    path = out[recipe]
    block, linears = LAYOUT[arch]
    tensors = _tensors(path)
    source = _tensors(src)
    packed = RECIPES[recipe]["scheme"] == "W4A16"
    for i in range(2):
        for e in range(NUM_EXPERTS):
            for leaf in linears:
                key = f"model.layers.{i}.{block}.experts.{e}.{leaf}"
                if packed:
                    assert tensors[f"{key}.weight_packed"].dtype == torch.int32, key
                    assert f"{key}.weight" not in tensors
                else:
                    want = torch.int8 if recipe.startswith("w8a8") else torch.float8_e4m3fn
                    assert tensors[f"{key}.weight"].dtype == want, key
                assert f"{key}.weight_scale" in tensors, key
        # the router stays float, bit for bit, and is listed in ignore (vLLM's routers are linears)
        router = f"model.layers.{i}.{block}.gate"
        assert tensors[f"{router}.weight"].dtype == torch.float32
        assert torch.equal(tensors[f"{router}.weight"], source[f"{router}.weight"])
        assert router in _config(path)["quantization_config"]["ignore"]
    assert not any("gate_up_proj" in k or k.endswith("experts.down_proj") for k in tensors)
    log = json.loads((path / "quantization_log.json").read_text())
    assert len(log["modules"]) == 2 * LINEARS[arch]
    if arch == "Qwen2MoeForCausalLM":   # the shared expert quantized, its one-output gate kept
        for i in range(2):
            assert f"model.layers.{i}.mlp.shared_expert.down_proj.weight_scale" in tensors
            gate = f"model.layers.{i}.mlp.shared_expert_gate"
            assert torch.equal(tensors[f"{gate}.weight"], source[f"{gate}.weight"])
            assert gate in _config(path)["quantization_config"]["ignore"]
    if "gptq" in recipe:
        experts = {k: v for k, v in log["modules"].items() if ".experts." in k}
        assert len(experts) == 2 * 3 * NUM_EXPERTS and all(v["algorithm"] == "gptq" for v in experts.values())


@pytest.mark.parametrize("recipe", ["w4a16-rtn", "w4a16-gptq"])
def test_transformers_compressed_tensors_logits_equal_quantkit_load(moe, recipe):
    arch, src, out = moe
    assert relative_logit_error(out[recipe]) <= 1e-3
    model = quantkit.load(out[recipe])
    assert model.quantkit_info["quantized_modules"] == 2 * LINEARS[arch]


@pytest.mark.parametrize("recipe", ["w8a8-rtn", "w8a8-gptq", "fp8-dynamic"])
def test_int8_and_fp8_experts_decode_as_compressed_tensors_does(moe, recipe):
    """Every expert's tensors, decompressed by compressed-tensors' own compressor, are quantkit's."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    arch, src, out = moe
    path = out[recipe]
    qc = _config(path)["quantization_config"]
    scheme_ct = QuantizationScheme.model_validate(qc["config_groups"]["group_0"])
    scheme = parse_quantization_config(qc)[0]["group_0"]
    compressor = BaseCompressor.get_value_from_registry(qc["format"])
    tensors = _tensors(path)
    block, linears = LAYOUT[arch]
    for i in range(2):
        for e in range(NUM_EXPERTS):
            for leaf in linears:
                prefix = f"model.layers.{i}.{block}.experts.{e}.{leaf}."
                sd = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
                theirs = compressor.decompress(dict(sd), scheme_ct)["weight"]
                assert torch.equal(decompress_module(sd, scheme, theirs.dtype), theirs), prefix


def test_transformers_refuses_int8_moe_experts(moe):
    """transformers 5.24's MoE loader decompresses packed and FP8 experts, not int-quantized
    (W8A8) ones: recorded so that this test fails the day it reads them (then compare logits)."""
    arch, src, out = moe
    with pytest.raises(RuntimeError, match="conversion"):
        AutoModelForCausalLM.from_pretrained(out["w8a8-rtn"])


@pytest.fixture(scope="module")
def starved(tmp_path_factory):
    """A Mixtral and a Qwen3-MoE whose routers never pick experts 2 and 3 under top-2."""
    root = tmp_path_factory.mktemp("starved")
    return {arch: make_moe_dir(root / arch, arch, starve=True) for arch in MOE_ARCHS}


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_all_experts_mode_reaches_every_expert_and_routed_mode_shows_the_starved(starved, arch, tmp_path):
    block, linears = LAYOUT[arch]
    runs = {}
    for mode in ("all", "routed"):
        lines: list[str] = []
        rec = {**RECIPES["w4a16-gptq"], "calibration": {"moe_experts": mode, "moe_min_tokens": 8}}
        path = quantkit.quantize(starved[arch], rec, CALIB, quantkit.ConvertOptions(log=lines.append)).save(tmp_path / mode)
        runs[mode] = (json.loads((path / "quantization_log.json").read_text()), lines, _tensors(path))
    real_tokens = sum(map(len, CALIB))
    log, lines, _ = runs["all"]
    experts = {k: v for k, v in log["modules"].items() if ".experts." in k}
    assert len(experts) == 2 * 3 * NUM_EXPERTS
    assert all(v["tokens"] > 0 for v in experts.values())   # every expert's Hessian has tokens
    cov = log["moe_coverage"]
    assert cov["mode"] == "all" and cov["under_min"] == {}
    for row in cov["layers"].values():
        assert row["calibrated"] == [real_tokens] * NUM_EXPERTS
        assert row["routed"][2:] == [0, 0] and sum(row["routed"]) == 2 * real_tokens   # top-2 routing

    log, lines, tensors = runs["routed"]
    cov = log["moe_coverage"]
    layers = [f"model.layers.{i}.{block}.experts" for i in range(2)]
    assert cov["mode"] == "routed" and cov["under_min"] == {name: [2, 3] for name in layers}
    for name in layers:
        assert cov["layers"][name]["calibrated"][2:] == [0, 0]
        assert log["modules"][f"{name}.3.{linears[2]}"]["tokens"] == 0
        assert log["modules"][f"{name}.0.{linears[0]}"]["tokens"] > 0
    # the conversion's output shows the table and flags the starved experts
    assert any(line.startswith(f"  {layers[0]}: ") and "under the minimum: expert 2, 3" in line for line in lines)
    assert any(line.startswith("warning: 4 of 8 experts got fewer than 8") for line in lines)
    # an expert no token reached is rounded to nearest (H = I), not erased as all dead columns
    rtn = _tensors(quantkit.quantize(starved[arch], RECIPES["w4a16-rtn"]).save(tmp_path / "rtn"))
    key = f"{layers[0]}.3.{linears[0]}.weight_packed"
    assert torch.equal(tensors[key], rtn[key])
    assert log["modules"][f"{layers[0]}.3.{linears[0]}"]["dead_columns"] == 0


def test_in_memory_moe_model_gives_the_folder_checkpoint(tmp_path):
    arch = "MixtralForCausalLM"
    src = make_moe_dir(tmp_path / "src", arch)
    model = AutoModelForCausalLM.from_pretrained(src)
    from_memory = _tensors(quantkit.quantize(model, RECIPES["w4a16-gptq"], calibration=CALIB).save(tmp_path / "m"))
    from_folder = _tensors(quantkit.quantize(src, RECIPES["w4a16-gptq"], calibration=CALIB).save(tmp_path / "f"))
    assert from_memory.keys() == from_folder.keys()
    assert all(torch.equal(from_memory[k], from_folder[k]) for k in from_folder)
    assert set(per_expert_state(model.state_dict(), model.config)) == set(_tensors(src))


@pytest.mark.parametrize("key,value,message", [
    ("moe_experts", "some", "calibration.moe_experts"),
    ("moe_experts", True, "calibration.moe_experts"),
    ("moe_min_tokens", -1, "calibration.moe_min_tokens"),
    ("moe_min_tokens", "8", "calibration.moe_min_tokens"),
])
def test_moe_calibration_keys_are_validated(key, value, message):
    with pytest.raises(QuantkitError, match=message):
        quantkit.load_recipe({"scheme": "W4A16", "calibration": {key: value}})


def test_static_activations_on_a_starved_expert_fail_naming_it(starved, tmp_path):
    rec = {"scheme": "FP8", "calibration": {"moe_experts": "routed"}}
    with pytest.raises(QuantkitError, match=r"mlp\.experts\.2\.gate_proj: no calibration token reached it"):
        quantkit.quantize(starved["Qwen3MoeForCausalLM"], rec, calibration=CALIB)
    # every token through every expert: each static input scale is calibrated
    path = quantkit.quantize(starved["Qwen3MoeForCausalLM"], {"scheme": "FP8"}, calibration=CALIB).save(tmp_path / "q")
    tensors = _tensors(path)
    assert all(float(tensors[f"model.layers.{i}.mlp.experts.{e}.{leaf}.input_scale"]) > 0
               for i in range(2) for e in range(NUM_EXPERTS) for leaf in ("gate_proj", "up_proj", "down_proj"))


def test_mixed_precision_refuses_moe_models(starved):
    rec = {"scheme": "W4A16", "group_size": 32, "mixed": {"budget_bits": 6.0}}
    with pytest.raises(QuantkitError, match="mixed: mixed precision does not plan MoE models yet"):
        quantkit.quantize(starved["MixtralForCausalLM"], rec, calibration=CALIB)


def test_inspect_shows_the_coverage_table(starved, tmp_path):
    from typer.testing import CliRunner

    from quantkit.cli import app

    rec = {**RECIPES["w4a16-gptq"], "calibration": {"moe_experts": "routed", "moe_min_tokens": 8}}
    path = quantkit.quantize(starved["MixtralForCausalLM"], rec, calibration=CALIB).save(tmp_path / "q")
    res = CliRunner().invoke(app, ["inspect", str(path)])
    assert res.exit_code == 0, res.output
    assert "expert coverage (calibration tokens per expert; mode routed, minimum 8)" in res.output
    assert "model.layers.1.block_sparse_moe.experts: 128 128 0 0  under the minimum: expert 2, 3" in res.output


@pytest.mark.parametrize("mode", ["all", "routed"])
def test_padding_never_reaches_the_experts_statistics(tmp_path, mode):
    """Samples of 32, 17 and 9 tokens pack into rows of 32 with 6 padding positions: every
    expert, and the shared expert, sees real tokens only."""
    arch = "Qwen2MoeForCausalLM"
    src = make_moe_dir(tmp_path / "src", arch)
    calib = [ids[:n] for ids, n in zip(random_ids(3, 32, seed=2), (32, 17, 9))]
    rec = {**RECIPES["w4a16-gptq"], "calibration": {"moe_experts": mode}}
    log = json.loads((quantkit.quantize(src, rec, calibration=calib).save(tmp_path / "q")
                      / "quantization_log.json").read_text())
    real = 32 + 17 + 9
    for i in range(2):
        row = log["moe_coverage"]["layers"][f"model.layers.{i}.mlp.experts"]
        assert sum(row["routed"]) == 2 * real   # top-2 of each real token, none of the padding
        assert row["calibrated"] == ([real] * NUM_EXPERTS if mode == "all" else row["routed"])
        assert log["modules"][f"model.layers.{i}.mlp.shared_expert.gate_proj"]["tokens"] == real
        for e in range(NUM_EXPERTS):
            assert log["modules"][f"model.layers.{i}.mlp.experts.{e}.down_proj"]["tokens"] == row["calibrated"][e]


@pytest.mark.parametrize("true_sequential", [True, False])
def test_gptq_rerunning_the_layer_per_batch_covers_the_experts_alike(starved, tmp_path, true_sequential):
    """Two calibration batches (no lockstep pass): one layer pass per sub-group, or one for all;
    the coverage sums both batches, and the starved experts are still flagged and rounded."""
    rec = {"scheme": "W4A16", "group_size": 32, "steps": [{"gptq": {"true_sequential": true_sequential}}],
           "calibration": {"moe_experts": "routed", "batch_tokens": 64, "moe_min_tokens": 8}}
    lines: list[str] = []
    path = quantkit.quantize(starved["MixtralForCausalLM"], rec, CALIB, quantkit.ConvertOptions(log=lines.append)).save(tmp_path / "q")
    assert any("2 batches per layer" in line and "one pass" not in line for line in lines)
    log = json.loads((path / "quantization_log.json").read_text())
    layer = "model.layers.0.block_sparse_moe.experts"
    assert log["moe_coverage"]["layers"][layer]["calibrated"] == [128, 128, 0, 0]
    assert log["modules"][f"{layer}.1.w2"]["tokens"] == 128 and log["modules"][f"{layer}.2.w2"]["tokens"] == 0
    assert log["modules"][f"{layer}.2.w2"]["dead_columns"] == 0


def _two_rank_coverage(rank: int, world: int, port: int, src: str, out: str) -> None:
    import os

    from quantkit.common import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rec = {"scheme": "W4A16", "group_size": 32, "algorithm": "gptq",
               "calibration": {"moe_experts": "routed", "batch_tokens": 64, "moe_min_tokens": 8}}
        q = quantkit.quantize(src, rec, calibration=CALIB)
        if distributed.is_writer():
            q.save(out)
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_count_every_ranks_tokens_in_the_coverage_table(starved, tmp_path):
    """Each rank routes only its own batch; the table rank 0 writes sums both ranks' tokens."""
    import torch.multiprocessing as mp

    from quantkit.common import distributed

    src = starved["MixtralForCausalLM"]
    # spawned: a child forked after the parent's OpenMP pool ran hung in its first parallel op
    mp.start_processes(_two_rank_coverage, args=(2, distributed.free_port(), str(src), str(tmp_path / "two")),
                       nprocs=2, join=True, start_method="spawn")
    log = json.loads((tmp_path / "two" / "quantization_log.json").read_text())
    layer = "model.layers.0.block_sparse_moe.experts"
    # two batches of 64 positions (two rows each), one per rank: 128 tokens, as one rank counts them
    assert log["moe_coverage"]["layers"][layer]["calibrated"] == [128, 128, 0, 0]
    assert sum(log["moe_coverage"]["layers"][layer]["routed"]) == 2 * 128
    assert log["moe_coverage"]["under_min"][layer] == [2, 3]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_offloaded_lockstep_parks_expert_inputs_and_gives_the_same_checkpoint(arch, tmp_path, monkeypatch):
    """The lockstep pass over several batches with the activations offloaded: each expert's
    gathered input is parked while its batch waits, and the checkpoint is the in-memory one."""
    from quantkit.pipeline import batches as pipeline
    from quantkit.pipeline import park as park_mod
    from quantkit.pipeline import passes

    src = make_moe_dir(tmp_path / "src", arch)
    monkeypatch.setattr(pipeline, "MICRO_BATCH_TOKENS", 32)   # one sample per batch: 4 in lockstep
    monkeypatch.setattr(park_mod, "MIN_PARK_BYTES", 1)        # the tiny model's tensors are small
    rec = {"scheme": "W4A16", "group_size": 32, "algorithm": "gptq", "calibration": {"moe_experts": "all"}}
    lines: list[str] = []
    mem = quantkit.quantize(src, rec, CALIB, quantkit.ConvertOptions(log=lines.append)).save(tmp_path / "mem")
    assert any("4 batches per layer, all in one pass" in line for line in lines), lines
    parked = []
    real = passes.park_tensors
    monkeypatch.setattr(passes, "park_tensors", lambda tensors, path: parked.append(path) or real(tensors, path))
    rec["calibration"]["offload"] = True
    disk = quantkit.quantize(src, rec, CALIB, quantkit.ConvertOptions(workdir=tmp_path / "work")).save(tmp_path / "disk")
    assert len(parked) >= 4 * NUM_EXPERTS * 2   # every batch waits at least at each expert's gate and down
    a, b = _tensors(mem), _tensors(disk)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
