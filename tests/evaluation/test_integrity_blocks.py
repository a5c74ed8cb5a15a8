"""The integrity pass on FP8 blocks, MXFP8, W4AFP8, W4A8 and 3-bit checkpoints: clean ones name
nothing, damage planted into one module's files is named, module and all.

MX scales are E8M0 exponents (uint8): their faults are planted as exponents, 255 being the
format's NaN and one more the scale doubled.
"""
import pytest
from model_factory import make_outlier_llama_dir, random_ids
from planted import (assert_named_alone, assert_names_nothing, doubled, e8m0_doubled, e8m0_nan, nan_one, plant,
                     removed, shuffled_run, zero_block)

import quantkit

FP8 = {"num_bits": 8, "type": "float", "symmetric": True}
INT = {"type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
TOKEN_FP8 = dict(FP8, strategy="token", dynamic=True)
RECIPES = {
    # the tiny model's widths (64, 128, 256) take 32-wide blocks and groups, not the presets' 128
    "fp8-block": {"weights": dict(FP8, strategy="block", block_structure=[32, 32]),
                  "input_activations": dict(FP8, strategy="group", group_size=32, dynamic=True)},
    "mxfp8": {"weights": dict(FP8, strategy="group", group_size=32, scale_dtype="torch.uint8"),
              "input_activations": dict(FP8, strategy="group", group_size=32, dynamic=True, scale_dtype="torch.uint8")},
    "w4afp8": {"weights": dict(INT, num_bits=4), "input_activations": TOKEN_FP8},
    "w4a8": {"weights": dict(INT, num_bits=4), "input_activations": {"num_bits": 8, "strategy": "token", "dynamic": True}},
    "w3a16": {"weights": dict(INT, num_bits=3)},
    "w3a16-gptq": {"weights": dict(INT, num_bits=3, actorder="weight", observer="mse")},
}
MODULE = "model.layers.1.self_attn.q_proj"


def _recipe(name: str) -> dict:
    return {"version": 1, "config_groups": {"group_0": {"targets": ["Linear"], **RECIPES[name]}},
            "ignore": ["lm_head"], "steps": ["gptq" if name.endswith("gptq") else "rtn"],
            "calibration": {"num_samples": 16, "max_seq_len": 64}}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity-blocks")
    src = make_outlier_llama_dir(root / "src", outliers=4, factor=20.0, spread=1.0)
    calib = random_ids(16, 64, vocab=256, seed=1)
    return src, {n: quantkit.quantize(str(src), _recipe(n), calibration=calib).save(root / n) for n in RECIPES}


@pytest.mark.parametrize("name", RECIPES)
def test_an_untouched_checkpoint_names_nothing(converted, name):
    src, out = converted
    assert_names_nothing(src, out[name])


FAULTS = {"zeroed block of scales": zero_block, "every scale x2": doubled, "a NaN scale": nan_one,
          "permuted run of codes": shuffled_run, "a missing tensor": removed}
MX_FAULTS = {"every scale x2": e8m0_doubled, "a NaN scale": e8m0_nan}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", RECIPES)
def test_planted_damage_is_named(converted, tmp_path, name, fault):
    src, out = converted
    change = MX_FAULTS.get(fault, FAULTS[fault]) if name == "mxfp8" else FAULTS[fault]
    codes = "weight_packed" if name.startswith(("w3", "w4afp8")) else "weight"
    leaf = codes if fault == "permuted run of codes" else "weight_scale"
    bad = plant(out[name], tmp_path / "bad", f"{MODULE}.{leaf}", change)
    assert_named_alone(src, bad, MODULE, fault)
