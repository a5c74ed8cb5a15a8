"""sensitivity.json: a round trip keeps every number; a file that is not one is one line."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.sensitivity import FormatUnit, Sensitivity, candidate
from quantkit.sensitivity.agreement import spearman


def make_sensitivity() -> Sensitivity:
    units = [FormatUnit(f"model.layers.{i}.mlp.down_proj", (f"model.layers.{i}.mlp.down_proj",), ((64, 128),), i)
             for i in range(3)]
    cands = {"W4_G32": candidate("W4_G32").weights, "W8_CHANNEL": candidate("W8_CHANNEL").weights, "KEEP": None}
    nbytes = {u.name: {c: u.nbytes(a, torch.float32) for c, a in cands.items()} for u in units}
    scores = {"diag": {u.name: {"W4_G32": 1e-3 * (i + 1), "W8_CHANNEL": 1e-5 / (i + 1)} for i, u in enumerate(units)}}
    return Sensitivity({"architecture": "LlamaForCausalLM", "dtype": "float32"}, cands, units, nbytes, scores, "diag",
                       {"num_tokens": 100}, exact={units[0].name: {"W4_G32": 0.0011}})


def test_round_trip(tmp_path):
    s = make_sensitivity()
    back = Sensitivity.load(s.save(tmp_path / "sensitivity.json"))
    assert back.to_dict() == s.to_dict()
    assert back.candidates == s.candidates and back.units == s.units
    assert back.ranking("W4_G32")[0] == ("model.layers.2.mlp.down_proj", 3e-3)
    assert back.damage("model.layers.0.mlp.down_proj", "KEEP") == 0.0


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(kind="other"), "not a quantkit sensitivity file"),
    (lambda d: d.update(version=7), "sensitivity format version 7"),
    (lambda d: d.pop("units"), "malformed sensitivity data (KeyError"),
    (lambda d: d.update(method="token"), "method 'token' has no scores"),
])
def test_bad_files_are_one_line(tmp_path, edit, needle):
    d = make_sensitivity().to_dict()
    edit(d)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(d))
    with pytest.raises(QuantkitError) as e:
        Sensitivity.load(path)
    assert needle in str(e.value) and str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_spearman():
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]) == 0.8
    assert spearman([1.0, 1.0, 2.0], [5.0, 6.0, 7.0]) == 0.866
    assert spearman([3.0, 2.0, 1.0], [1.0, 2.0, 3.0]) == -1.0
