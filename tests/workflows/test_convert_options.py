"""``quantize``'s options object: checked when built, and each option doing what the flag does."""

import json

import pytest

import quantkit
from quantkit.sensitivity import SearchOptions


@pytest.mark.parametrize("kwargs,needle", [
    ({"device": "meta"}, "--device: device type 'meta' is not supported"),
    ({"device": "cuda:x"}, "--device: 'cuda:x' is not a device name"),
    ({"ignore": "lm_head"}, "ignore: a list of module names or 're:' patterns, got the string 'lm_head'"),
    ({"resume": "yes"}, "resume: must be true or false, got 'yes'"),
    ({"trust_remote_code": 1}, "trust_remote_code: must be true or false, got 1"),
])
def test_options_are_refused_when_built_naming_the_key(kwargs, needle):
    with pytest.raises(quantkit.QuantkitError) as e:
        quantkit.ConvertOptions(**kwargs)
    assert needle in str(e.value)


def test_ignore_keeps_the_modules_it_names_in_high_precision(tiny_llama, tmp_path):
    options = quantkit.ConvertOptions(ignore=["re:.*down_proj"], log=lambda _: None)
    path = quantkit.quantize(tiny_llama, "w8a16", None, options).save(tmp_path / "q")
    modules = json.loads((path / "quantization_log.json").read_text())["modules"]
    assert modules and not any(name.endswith("down_proj") for name in modules)
    assert any(name.endswith("up_proj") for name in modules)
    ignore = json.loads((path / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.0.mlp.down_proj" in ignore


def test_an_ignore_option_that_matches_nothing_fails_naming_it(tiny_llama):
    with pytest.raises(quantkit.QuantkitError, match="--ignore: 'nothing' matches no Linear module"):
        quantkit.quantize(tiny_llama, "w8a16", options=quantkit.ConvertOptions(ignore=["nothing"]))


def test_search_options_refuse_an_unknown_method():
    with pytest.raises(ValueError, match="method must be one of"):
        SearchOptions(method="cubic")
