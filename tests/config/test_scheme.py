import pytest

from quantkit.errors import QuantkitError
from quantkit.config.scheme import PRESETS, QuantArgs, QuantScheme, preset


def test_strategy_inferred():
    assert QuantArgs(num_bits=4, group_size=64).strategy == "group"
    assert QuantArgs(num_bits=8).strategy == "channel"
    assert QuantArgs(num_bits=8, dynamic=True).strategy == "token"


@pytest.mark.parametrize("kwargs,key", [
    ({"num_bits": 8, "strategy": "token"}, "strategy"),            # static per-token
    ({"num_bits": 4, "strategy": "group"}, "group_size"),          # group without a size
    ({"num_bits": 4, "group_size": 0}, "group_size"),
    ({"num_bits": 4, "strategy": "channel", "group_size": 64}, "group_size"),
    ({"num_bits": 9}, "num_bits"),
    ({"num_bits": 6, "type": "float"}, "num_bits"),
    ({"num_bits": 4, "type": "float"}, "group_size"),                  # FP4 without the format's groups
    ({"num_bits": 4, "type": "float", "group_size": 64}, "group_size"),
    ({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 16}, "group_size"),
    ({"num_bits": 4, "type": "float", "group_size": 32, "dynamic": "local"}, "dynamic"),
    ({"num_bits": 4, "strategy": "tensor_group", "group_size": 16}, "strategy"),   # int with a global scale
    ({"type": "float", "symmetric": False}, "symmetric"),
    ({"num_bits": 4, "actorder": "group"}, "actorder"),
    ({"num_bits": 4, "observer": "percentile"}, "observer"),
])
def test_invalid_args_name_the_key(kwargs, key):
    with pytest.raises(QuantkitError, match=key):
        QuantArgs(**kwargs)


def test_from_dict_rejects_unknown_key():
    with pytest.raises(QuantkitError, match="unknown key 'bits'"):
        QuantArgs.from_dict({"bits": 4})
    with pytest.raises(QuantkitError, match=r"scheme.weights.*unknown key 'groupsize'"):
        QuantScheme.from_dict({"weights": {"num_bits": 4, "groupsize": 64}})


def test_group_size_must_divide_width():
    args = QuantArgs(num_bits=4, group_size=128)
    args.check_width(256, "x")
    with pytest.raises(QuantkitError, match="group_size 128 does not divide in_features 576"):
        args.check_width(576, "model.layers.0.self_attn.q_proj")


def test_presets_and_formats():
    assert preset("w4a16").format == "pack-quantized"
    assert preset("W8A16").format == "pack-quantized"
    assert preset("W8A8").format == "int-quantized"
    assert preset("FP8").format == "float-quantized"
    assert preset("FP8_DYNAMIC").input_activations.strategy == "token"
    assert PRESETS["W4A16_ASYM"].weights.symmetric is False
    with pytest.raises(QuantkitError, match="unknown preset"):
        preset("W3A5")


def test_impossible_activation_schemes():
    w8 = QuantArgs(num_bits=8)
    with pytest.raises(QuantkitError, match="input_activations"):   # int4 weights: activations per token
        QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=64), QuantArgs(num_bits=8, strategy="tensor"))
    with pytest.raises(QuantkitError, match="input_activations"):   # 4-bit activations
        QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=64), QuantArgs(num_bits=4, dynamic=True))
    w4a8 = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=64), QuantArgs(num_bits=8, dynamic=True))
    assert w4a8.format == "int-quantized"
    with pytest.raises(QuantkitError, match="weights.dynamic"):
        QuantScheme(("Linear",), QuantArgs(num_bits=8, dynamic=True, strategy="channel"))
    assert QuantScheme(("Linear",), w8, QuantArgs(num_bits=8, dynamic=True)).format == "int-quantized"


def test_round_trip_to_dict_matches_compressed_tensors():
    import compressed_tensors.quantization as ct
    for name, s in PRESETS.items():
        d = s.to_dict()
        parsed = ct.QuantizationScheme.model_validate(d)
        assert parsed.weights.num_bits == s.weights.num_bits, name
        assert parsed.weights.strategy == s.weights.strategy, name
