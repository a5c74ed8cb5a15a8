"""benchmarks/peers.py: every toolkit's cell asks for the format its row names, and the workers'
grid check refuses a weight the peer left unquantized.

A mapping error here (a group of 128 where the row says 64, an NVFP4 preset that also quantizes
activations) would put two different formats side by side in one table row without any error.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    if str(ROOT / "benchmarks") not in sys.path:   # after the tests' own: benchmarks/families.py must not shadow tests/families.py
        sys.path.append(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def peers():
    return _module("peers")


@pytest.fixture(scope="module")
def workers():
    return _module("peer_workers")


def _weights_of(recipe) -> dict:
    group = recipe.to_dict()["config_groups"] if "config_groups" in recipe.to_dict() else None
    if group is None:
        from quantkit.config.scheme import PRESETS

        return PRESETS[recipe.to_dict()["scheme"]].to_dict()["weights"]
    return next(iter(group.values()))["weights"]


@pytest.mark.parametrize("fmt", ["w4a16-g128", "w4a16-g64", "w3a16-g64", "nvfp4a16", "mxfp4a16"])
def test_quantkit_runs_the_format_its_row_names(peers, fmt):
    import quantkit
    from formats import recipe_of

    want = peers.FORMATS[fmt]
    for name, settings in peers.recipes_for("quantkit", fmt, shipped=[]).items():
        recipe = quantkit.load_recipe(peers.edited(recipe_of(settings["label"], 4, 64), settings.get("edit", {})))
        w = _weights_of(recipe)
        assert (w["num_bits"], w["group_size"]) == (want["bits"], want["group_size"]), (fmt, name, w)
        assert w["type"] == ("int" if want["type"] == "int" else "float"), (fmt, name, w)
        assert recipe.needs_calibration == (name != "rtn"), (fmt, name)


@pytest.mark.parametrize("fmt", ["w4a16-g128", "w4a16-g64", "w3a16-g64", "nvfp4a16", "mxfp4a16"])
def test_llm_compressor_runs_the_format_its_row_names_weight_only(peers, fmt):
    from compressed_tensors.quantization import preset_name_to_scheme

    want = peers.FORMATS[fmt]
    for name, settings in peers.recipes_for("llmc", fmt).items():
        if "scheme" in settings:
            scheme = preset_name_to_scheme(settings["scheme"], ["Linear"])
            assert scheme.input_activations is None, (fmt, name)
            w = scheme.weights.model_dump()
        else:
            w = settings["weights"]
        assert (w["num_bits"], w["group_size"]) == (want["bits"], want["group_size"]), (fmt, name, w)
        assert w["symmetric"] is True


@pytest.mark.parametrize("fmt", ["w4a16-g128", "w4a16-g64", "w3a16-g64", "nvfp4a16", "mxfp4a16"])
def test_autoround_and_gptqmodel_run_the_format_their_rows_name(peers, fmt):
    want = peers.FORMATS[fmt]
    for name, settings in peers.recipes_for("autoround", fmt).items():
        s = settings["scheme"]
        assert (s["bits"], s["group_size"], s["act_bits"]) == (want["bits"], want["group_size"], 16), (fmt, name)
    assert {k: v["options"]["iters"] for k, v in peers.recipes_for("autoround", fmt).items()} == \
        {"rtn": 0, "default": 200, "light": 50, "best": 1000}
    for name, settings in peers.recipes_for("gptqmodel", fmt).items():
        if "not_offered" in settings:
            assert want["type"] != "int"
            continue
        c = settings["config"]
        assert (c["bits"], c["group_size"], c["sym"]) == (want["bits"], want["group_size"], True)
        assert ("gptaq" in c) == (name == "gptaq")


def test_learned_and_gptaq_recipes_join_their_format_only(peers):
    names = ["w4a16-learned", "w4a16-g64-learned", "w4a16-g64-gptq-gptaq", "nvfp4a16-learned-fast", "w8a16-learned"]
    assert peers.quantkit_extras("w4a16-g128", names) == {"learned": "w4a16-learned"}
    assert peers.quantkit_extras("w4a16-g64", names) == {"gptq-gptaq": "w4a16-g64-gptq-gptaq",
                                                         "learned": "w4a16-g64-learned"}
    assert peers.quantkit_extras("nvfp4a16", names) == {"learned-fast": "nvfp4a16-learned-fast"}
    assert peers.quantkit_extras("mxfp4a16", names) == {}


@pytest.mark.parametrize("fmt", ["w4a16-g64", "nvfp4a16"])
def test_quantkit_variants_change_only_what_they_name(peers, fmt):
    import quantkit
    from formats import recipe_of

    recipes = {name: quantkit.load_recipe(peers.edited(recipe_of(s["label"], 4, 64), s.get("edit", {}))).to_dict()
                for name, s in peers.recipes_for("quantkit", fmt, shipped=[]).items()}
    (gptaq,), (gptq,) = (step.items() for step in (recipes["gptaq"]["steps"][0], recipes["gptq"]["steps"][0]))
    assert gptaq[0] == gptq[0] == "gptq"
    assert gptaq[1] == {**gptq[1], "gptaq": True} and not gptq[1].get("gptaq")
    assert _weights_of(quantkit.load_recipe(recipes["gptq-imatrix"]))["observer"] == "imatrix_mse"
    assert _weights_of(quantkit.load_recipe(recipes["gptq"]))["observer"] != "imatrix_mse"
    assert recipes["learned-fast"]["steps"] == [{"learned_rounding": {"preset": "fast"}}]
    assert _weights_of(quantkit.load_recipe(recipes["learned-fast"])) == _weights_of(quantkit.load_recipe(recipes["rtn"]))


def test_grid_check_refuses_an_unquantized_weight_and_passes_a_quantized_one(workers):
    torch.manual_seed(0)
    w = torch.randn(8, 128)
    fmt = {"type": "int", "bits": 4, "group_size": 64}
    with pytest.raises(RuntimeError, match="not quantized"):
        workers.check_grid("w", w, fmt)
    groups = w.reshape(-1, 64)
    scale = groups.abs().amax(dim=1, keepdim=True) / 7
    q = (torch.clamp(torch.round(groups / scale), -8, 7) * scale).reshape_as(w)
    workers.check_grid("w", q, fmt)
    with pytest.raises(RuntimeError, match="not quantized"):   # 3 bits hold 8 levels, not 16
        workers.check_grid("w", q, {**fmt, "bits": 3})


def test_table_pools_seeds_as_mean_and_half_range_and_quotes_errors(peers):
    rows = [{"model": "m", "format": "w4a16-g64", "toolkit": "llmc", "recipe": "gptq", "seed": s,
             "perplexity": p, "kl_mean": k, "cpu_s": 100.0, "peak_rss_mib": 900.0}
            for s, p, k in [(0, 30.0, 0.10), (1, 31.0, 0.12), (2, 32.0, 0.11)]]
    rows.append({"model": "m", "format": "nvfp4a16", "toolkit": "autoround", "recipe": "best", "seed": 0,
                 "error": "RuntimeError: no | cpu\nkernel"})
    text = peers.table(rows, "m")
    assert "| w4a16-g64 | llmc | gptq | 31.000 ± 1.000 (3 seeds) | 0.1100 ± 0.0100 (3 seeds) |" in text
    assert "error: `RuntimeError: no / cpu` |" in text   # the error's first line, a table cell still
    assert text.index("w4a16-g64") < text.index("nvfp4a16")
