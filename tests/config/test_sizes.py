"""One reading of a size: the recipe's sizes and ``--gpu-mem`` agree on every spelling."""

import doctest

import pytest

import quantkit.config.sizes
from quantkit.errors import QuantkitError
from quantkit.serving.memory_account import parse_bytes
from quantkit.recipe import Recipe

SPELLINGS = {"4096": 4096, "4096B": 4096, "60KB": 60 * 10**3, "2GB": 2 * 10**9, "2 gb": 2 * 10**9,
             "1.5GB": 1_500_000_000, "1TB": 10**12, "512MiB": 512 * 2**20, "2GiB": 2 * 2**30,
             "2G": 2 * 2**30, "2g": 2 * 2**30, "64K": 64 * 2**10, "512M": 512 * 2**20, "1T": 2**40}


def test_doctests():
    assert doctest.testmod(quantkit.config.sizes).failed == 0


def _recipe_bytes(text):
    return Recipe.from_dict({"scheme": "W4A16", "calibration": {"layer_memory": text}}).calibration.layer_memory


@pytest.mark.parametrize("text", sorted(SPELLINGS))
def test_recipe_and_plan_agree(text):
    assert quantkit.config.sizes.size_bytes(text) == parse_bytes(text) == _recipe_bytes(text) == SPELLINGS[text]


@pytest.mark.parametrize("text", ["lots", "2GBs", "-1GB", "GB", "", "1e999GB", "2 G B"])
def test_both_refuse_what_is_not_a_size(text):
    with pytest.raises(QuantkitError, match="--gpu-mem"):
        parse_bytes(text)
    with pytest.raises(QuantkitError, match="calibration.layer_memory"):
        _recipe_bytes(text)
