"""The AWQ ratio search's cheaper losses: the Gram form equals the forward replay's error, and the
screened search runs on what the first batch ranks best and chooses what the exhaustive search
chooses."""

from __future__ import annotations

import json

import pytest
import torch

import quantkit
from quantkit.transforms.observe import Replay
from quantkit.transforms.ratio_loss import LinearReplay, linear_output_error, screened_losses

from model_factory import make_outlier_llama_dir, random_ids


def test_group_gram_error_equals_the_forward_error():
    """Per (row, group): ``d^T G_g d`` with ``G_g = X_gᵀ X_g`` is the group's squared output error."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 96, generator=g, dtype=torch.float64) * torch.linspace(0.1, 4.0, 96, dtype=torch.float64)
    d = torch.randn(7, 96, generator=g, dtype=torch.float64)
    for k in range(0, 96, 32):
        xg, dg = x[:, k:k + 32], d[:, k:k + 32]
        for o in range(7):
            forward = (xg @ dg[o]).pow(2).sum()
            assert torch.isclose(linear_output_error(dg[o:o + 1], xg.T @ xg), forward, rtol=1e-12, atol=0)


def test_linear_replay_equals_the_forward_replay():
    """Two captured batches, a few positions left out of each: the Gram form's summed error is the
    forward replay's, for a changed weight."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 20, bias=True)
    batches = [torch.randn(3, 10, 48) * torch.linspace(0.2, 3.0, 48) for _ in range(2)]
    keeps = [torch.arange(30)[torch.arange(30) % 7 != 0], torch.arange(30)[2:]]
    replay = Replay(lin)
    with torch.no_grad():
        for x, keep in zip(batches, keeps):
            replay.calls.append(((x,), {}, keep))
            replay.reference.append(lin(x).reshape(-1, 20)[keep].float())
    gram_form = LinearReplay.from_calls(lin, replay.calls)
    lin.weight.data = lin.weight.data + 0.05 * torch.randn_like(lin.weight)
    forward = [replay.squared_error(p) for p in range(replay.parts)]
    error, count = gram_form.squared_error()
    assert count == sum(n for _, n in forward) == 20 * sum(int(k.numel()) for k in keeps)
    assert error == pytest.approx(sum(e for e, _ in forward), rel=1e-5)
    assert error > 0


def test_screen_runs_the_first_parts_best_and_the_one_always_reported_on_the_rest():
    first = dict(zip("abcdef", [5.0, 1.0, 4.0, 2.5, 6.0, 2.0]))
    rest = dict(zip("abcdef", [5.0, 1.0, 4.0, 1.5, 6.0, 4.0]))
    calls = []

    def error(c, part):
        calls.append((c, part))
        return (first if part == 0 else rest)[c], 1

    out = screened_losses(list(first), 2, error, keep=2, always="e")
    # d's whole loss (2.0) is below f's (3.0), but its first part ranked it third: not run on
    assert out == {"b": 1.0, "f": 3.0, "e": 6.0}
    assert sorted(c for c, p in calls if p == 1) == ["b", "e", "f"] and len(calls) == 6 + 3
    assert screened_losses(list(first), 2, error, keep=6, always="e") == {c: (first[c] + rest[c]) / 2 for c in first}
    assert screened_losses(list(first), 1, error, keep=2, always="e") == first     # one part: no screen


@pytest.fixture(scope="module")
def salient_llama(tmp_path_factory):
    return make_outlier_llama_dir(tmp_path_factory.mktemp("salient") / "llama", outliers=6, factor=12.0,
                                  spread=1.0, seed=3)


def test_screened_search_chooses_the_exhaustive_ratios(salient_llama, tmp_path):
    """Two calibration batches and clip ranges inside the search: running only the first batch's
    four best ratios on the second keeps the ratio the exhaustive search (every one run) chooses."""
    calib = random_ids(16, 64, seed=1)
    found = {}
    for label, finalists in {"screened": 4, "exhaustive": 21}.items():
        step = {"awq": {"clip_in_search": True, "clip_grid": 40, "finalists": finalists}}
        q = quantkit.quantize(salient_llama, {"scheme": "W4A16", "group_size": 32, "steps": [step, "rtn"],
                                              "calibration": {"batch_tokens": 512}}, calibration=calib)
        log = json.loads((q.save(tmp_path / label) / "quantization_log.json").read_text())
        found[label] = {layer: {m: info["ratio"] for m, info in t["0.awq"].items() if "ratio" in info}
                        for layer, t in log["transforms"].items()}
    assert found["screened"] == found["exhaustive"]
    assert any(r is not None and r > 0 for t in found["exhaustive"].values() for r in t.values())
