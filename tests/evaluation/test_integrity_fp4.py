"""The integrity pass on FP4 checkpoints: clean NVFP4 and MXFP4 checkpoints (RTN and GPTQ) name
nothing; damage planted into one module's files is named, module and all."""

from __future__ import annotations

import pytest
import torch
from planted import assert_names_nothing, convert_outlier_model, e8m0_doubled, judge, plant, removed, shuffled_run

from quantkit.evaluation.verdict import NOGO, REVIEW

RECIPES = {
    "nvfp4a16-rtn": {"scheme": "NVFP4A16"},
    "nvfp4a16-gptq": {"scheme": "NVFP4A16", "algorithm": {"name": "gptq", "block_size": 32}},
    "nvfp4-rtn": {"scheme": "NVFP4"},
    "mxfp4a16-rtn": {"scheme": "MXFP4A16"},
}
MODULE = "model.layers.1.self_attn.q_proj"


def _fp8_doubled(t: torch.Tensor) -> torch.Tensor:
    return (t.float() * 2).to(torch.float8_e4m3fn)


def _nibbles_swapped(t: torch.Tensor) -> torch.Tensor:
    """A packer that put the even column in the high nibble, for the first quarter of the rows."""
    rows = t.shape[0] // 4
    t[:rows] = (t[:rows] >> 4) | (t[:rows] << 4)
    return t


def _zeroed(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(t)


FAULTS = {
    "every scale x2": ("weight_scale", None),
    "nibble order swapped in some rows": ("weight_packed", _nibbles_swapped),
    "permuted run of packed codes": ("weight_packed", shuffled_run),
    "a missing tensor": ("weight_scale", removed),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity-fp4")
    return convert_outlier_model(root, RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_an_untouched_fp4_checkpoint_names_nothing(converted, name):
    src, out = converted
    report = assert_names_nothing(src, out[name])
    assert all(not m["problems"] and m["expected_from"] == "rows" for m in report.modules.values())
    assert max(m["recon_unit_excess_db"] for m in report.modules.values()) < -0.9


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", ["nvfp4a16-rtn", "nvfp4a16-gptq", "mxfp4a16-rtn"])
def test_planted_fp4_damage_is_named(converted, tmp_path, name, fault):
    src, out = converted
    leaf, change = FAULTS[fault]
    if change is None:
        change = e8m0_doubled if name.startswith("mx") else _fp8_doubled
    report, verdict, named = judge(src, plant(out[name], tmp_path / "bad", f"{MODULE}.{leaf}", change))
    assert verdict.decision in (REVIEW, NOGO)
    assert named == {MODULE}, [r.text() for r in verdict.reasons]
    assert report.unloadable == (fault == "a missing tensor")


@pytest.mark.parametrize("leaf", ["weight_global_scale", "input_global_scale"])
def test_a_zero_global_scale_is_named(converted, tmp_path, leaf):
    src, out = converted
    bad = plant(out["nvfp4-rtn"], tmp_path / "bad", f"{MODULE}.{leaf}", _zeroed)
    report, verdict, named = judge(src, bad)
    assert named == {MODULE} and verdict.decision == NOGO, [r.text() for r in verdict.reasons]
    assert any(leaf in p["text"] for p in report.modules[MODULE]["problems"])
