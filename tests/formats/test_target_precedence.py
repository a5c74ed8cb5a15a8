"""Which config group a module falls under: compressed-tensors' precedence, ties refused.

compressed-tensors (the reader transformers and vLLM use) resolves a module targeted by several
groups by the most specific target: an exact name, then a regex, then a class. quantkit writes
what that reader will read back, so the rule is checked against its own ``match_targets`` and
end to end: a checkpoint with an 8-bit down_proj group over a 4-bit Linear group keeps both
groups and loads in transformers + compressed-tensors with quantkit.load's logits.
"""

from __future__ import annotations

import json

import pytest
import torch
from compressed_tensors.utils.match import match_targets
from safetensors import safe_open

import quantkit
from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import group_for
from quantkit.runtime.modules import QuantLinear
from quantkit.config.scheme import QuantArgs, QuantScheme

from reference_reader import relative_logit_error

W4 = QuantArgs(num_bits=4, group_size=32)
W8 = QuantArgs(num_bits=8, strategy="channel")
DOWN = "model.layers.1.mlp.down_proj"


def _groups(**targets: tuple[str, ...]) -> dict[str, QuantScheme]:
    return {k: QuantScheme(t, W4) for k, t in targets.items()}


@pytest.mark.parametrize("targets,winner", [
    ({"all": ("Linear",), "down": ("re:.*down_proj",)}, "down"),            # regex beats class
    ({"down": ("re:.*down_proj",), "all": ("Linear",)}, "down"),            # whatever the order
    ({"re": ("re:.*mlp.*",), "one": (DOWN,)}, "one"),                       # exact beats regex
    ({"one": ("Linear", DOWN), "re": ("re:.*down_proj",)}, "one"),          # a group's best target counts
    ({"all": ("Linear",), "q": ("re:.*q_proj",)}, "all"),                   # a regex that misses
])
def test_most_specific_group_wins_as_compressed_tensors_resolves(targets, winner):
    groups = _groups(**targets)
    assert group_for(DOWN, "Linear", groups, []) == winner
    # compressed-tensors' own ordering: its first matching target belongs to the same group
    first = match_targets(DOWN, torch.nn.Linear(2, 2), [t for ts in targets.values() for t in ts])[0]
    assert first in targets[winner]


def test_ignore_beats_every_group():
    assert group_for(DOWN, "Linear", _groups(one=(DOWN,)), ["re:.*mlp"]) is None
    assert group_for(DOWN, "Linear", _groups(q=("re:.*q_proj",)), []) is None


@pytest.mark.parametrize("targets,rank", [
    ({"a": ("re:.*down_proj",), "b": ("re:.*mlp.*",)}, "regex"),
    ({"a": ("Linear",), "b": ("Linear",)}, "class"),
    ({"a": (DOWN,), "b": (DOWN, "Linear")}, "exact name"),
])
def test_equally_specific_groups_are_refused_naming_both(targets, rank):
    with pytest.raises(QuantkitError) as e:
        group_for(DOWN, "Linear", _groups(**targets), [], where="r.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("r.yaml: config_groups.a and config_groups.b both target")
    assert f"'{DOWN}' by {rank}" in msg


@pytest.fixture(scope="module")
def down8(tiny_llama, tmp_path_factory):
    recipe = {"config_groups": {
        "all": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}},
        "down8": {"targets": ["re:.*down_proj"], "weights": {"num_bits": 8, "strategy": "channel"}},
    }}
    return quantkit.quantize(tiny_llama, recipe).save(tmp_path_factory.mktemp("down8") / "ckpt")


def test_regex_group_over_class_group_is_written_and_packed_8_bit(down8):
    qc = json.loads((down8 / "config.json").read_text())["quantization_config"]
    assert set(qc["config_groups"]) == {"all", "down8"}
    assert qc["config_groups"]["down8"]["weights"]["num_bits"] == 8
    with safe_open(down8 / "model.safetensors", "pt") as f:
        for i in (0, 1):
            down = f.get_tensor(f"model.layers.{i}.mlp.down_proj.weight_packed")
            up = f.get_tensor(f"model.layers.{i}.mlp.up_proj.weight_packed")
            # int32 words hold 32 / bits codes: down_proj [64, 128 / 4], up_proj [128, 64 / 8]
            assert tuple(down.shape) == (64, 128 * 8 // 32) and tuple(up.shape) == (128, 64 * 4 // 32)
            assert f.get_tensor(f"model.layers.{i}.mlp.down_proj.weight_scale").shape[1] == 1  # channel
    model = quantkit.load(down8)
    assert model.model.layers[0].mlp.down_proj.scheme.weights.num_bits == 8
    assert model.model.layers[0].mlp.up_proj.scheme.weights.num_bits == 4


def test_mixed_groups_load_in_transformers_with_compressed_tensors(down8):
    assert relative_logit_error(down8, seed=3) < 1e-3
    assert isinstance(quantkit.load(down8).model.layers[1].mlp.down_proj, QuantLinear)
