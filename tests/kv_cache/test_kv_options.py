"""The evaluated KV options: names (``--kv``), the table, bytes per token by hand, and each
format's numbers against an independent reference (vLLM's per-token-head formula, KIVI's
min-max groups written out as loops)."""

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.kv_cache import FORMATS, kv_option, kv_options, per_token_head
from quantkit.kv_cache import kivi
from quantkit.kv_cache.numerics import FP8, INT8, channel_groups


# -- names -----------------------------------------------------------------------------------------
def test_every_format_and_part_parses_and_spells_itself():
    assert set(FORMATS) == {"fp8-tensor", "fp8-head", "fp8-token-head", "int8-token-head", "int8-kivi"}
    for name in FORMATS:
        assert kv_option(name).parts == ("k", "v") and kv_option(name).name == name
        assert kv_option(f"{name}:k").parts == ("k",) and kv_option(f"{name}:v").name == f"{name}:v"
    assert kv_option("fp8-head").format.static and not kv_option("int8-kivi").format.static
    assert kv_option("int8-token-head").format.engine == 'vLLM kv_cache_dtype="int8_per_token_head"'


@pytest.mark.parametrize("bad", ["fp8", "int4-kivi", "fp8-tensor:q", "fp8-tensor:k:v", ""])
def test_bad_names_are_one_line_naming_the_flag(bad):
    with pytest.raises(QuantkitError) as e:
        kv_option(bad)
    msg = str(e.value)
    assert msg.startswith(f"--kv: unknown KV option '{bad}'") and "\n" not in msg and "int8-kivi" in msg


def test_kv_options_takes_repeats_and_comma_lists_in_order():
    got = kv_options(["fp8-tensor,int8-kivi:k", "fp8-tensor", " fp8-head "])
    assert [o.name for o in got] == ["fp8-tensor", "int8-kivi:k", "fp8-head"]
    assert kv_options(None) == [] and [o.name for o in kv_options("int8-kivi:v")] == ["int8-kivi:v"]
    with pytest.raises(QuantkitError, match="--kv: unknown KV option 'nope'"):
        kv_options(["fp8-tensor,nope"])


# -- bytes per token (SmolLM2: 30 layers, 3 KV heads, head_dim 64; fp16 for what is not quantized) --
@pytest.mark.parametrize("name, per_head", [
    ("fp8-tensor", 64 + 64),                    # codes only: static scales are per layer
    ("fp8-head", 64 + 64),
    ("fp8-token-head", (64 + 4) * 2),           # + a float32 scale per token and head, K and V
    ("int8-token-head", (64 + 4) * 2),
    ("int8-kivi", (64 + 64 * 4 / 32) + (64 + 2 * 4)),   # K: fp16 scale+min per channel per 32 tokens; V: per 32 channels
    ("fp8-tensor:k", 64 + 2 * 64),              # V stays fp16
    ("int8-kivi:v", 2 * 64 + 64 + 8),
])
def test_bytes_per_token_by_hand(name, per_head):
    assert kv_option(name).bytes_per_token(layers=30, kv_heads=3, head_dim=64) == 30 * 3 * per_head
    fp16 = 30 * 3 * 2 * 64 * 2
    assert kv_option(name).bytes_per_token(30, 3, 64) < fp16


def test_kivi_residual_is_a_fixed_cost_per_request():
    assert kv_option("int8-kivi").residual_bytes(30, 3, 64) == 30 * 3 * 64 * 2 * kivi.RESIDUAL
    assert kv_option("int8-kivi:v").residual_bytes(30, 3, 64) == 0
    assert kv_option("fp8-token-head").residual_bytes(30, 3, 64) == 0


# -- numbers ---------------------------------------------------------------------------------------
def _vllm_per_token_head(x, qmax, integer):
    """vLLM's tests/quantization/test_per_token_kv_cache.py reference, written out."""
    scales = (x.float().abs().amax(dim=-1) / qmax).clamp(min=1e-6)
    scaled = x.float() * (1.0 / scales.unsqueeze(-1))
    q = scaled.round().clamp(-128, 127) if integer else scaled.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return q * scales.unsqueeze(-1)


@pytest.mark.parametrize("codes", [FP8, INT8])
def test_per_token_head_is_vllms_formula_and_token_local(codes):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 17, 64, generator=g) * torch.rand(2, 3, 17, 1, generator=g) * 10
    x[0, 1, 4] = 0.0   # an all-zero head stays zero (scale floor 1e-6)
    got = per_token_head(x, codes)
    torch.testing.assert_close(got, _vllm_per_token_head(x, codes.qmax, codes.integer), rtol=0, atol=0)
    assert torch.equal(got[0, 1, 4], torch.zeros(64))
    amax = x.abs().amax(dim=-1)
    torch.testing.assert_close(got.abs().amax(dim=-1), amax, rtol=1e-6, atol=0)   # the absmax survives
    if codes is INT8:
        assert ((got - x).abs() <= (amax / 127 / 2 * (1 + 1e-5)).unsqueeze(-1)).all()
    y = x.clone()
    y[:, :, 5] *= 100   # another token's range changes nothing here
    assert torch.equal(per_token_head(y, codes)[:, :, :5], got[:, :, :5])


def _minmax(x, dim):
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    s = (hi - lo) / 255
    q = torch.where(s > 0, ((x - lo) / torch.where(s > 0, s, 1)).round().clamp(0, 255), 0)
    return q * s + lo


def test_kivi_values_per_token_over_32_channels():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(2, 3, 9, 64, generator=g)
    want = torch.cat([_minmax(v[..., c:c + 32], -1) for c in (0, 32)], dim=-1)
    torch.testing.assert_close(channel_groups(v, 32), want, rtol=0, atol=1e-6)
    assert ((channel_groups(v, 32) - v).abs() <= (v.amax(-1) - v.amin(-1)).unsqueeze(-1) / 255 / 2 + 1e-6).all()
    odd = torch.randn(1, 1, 4, 24, generator=g)   # 24 channels: one group per head
    torch.testing.assert_close(channel_groups(odd, 32), _minmax(odd, -1), rtol=0, atol=1e-6)


def test_kivi_keys_per_channel_over_32_positions_below_the_cutoff():
    """Row 1 is left-padded by 5 (negative positions): its groups start at its first real token,
    padding is neither quantized nor counted; keys at or past the cutoff are the residual."""
    g = torch.Generator().manual_seed(2)
    k = torch.randn(2, 2, 80, 8, generator=g)
    k[1, :, :5] = 1e4   # padding with a huge range: must not reach any group
    pos = torch.stack([torch.arange(80), torch.arange(80) - 5])
    below = torch.tensor([64, 64])
    got = kivi.quantize_keys(k, pos, below)
    for b, first in ((0, 0), (1, 5)):
        for g0 in (0, 32):
            sl = slice(first + g0, first + g0 + 32)
            torch.testing.assert_close(got[b, :, sl], _minmax(k[b, :, sl], 1), rtol=0, atol=1e-6)
        assert torch.equal(got[b, :, first + 64:], k[b, :, first + 64:])
    assert torch.equal(got[1, :, :5], k[1, :, :5])
    assert not torch.equal(got[0, :, :64], k[0, :, :64])


def test_kivi_cutoffs_keep_the_newest_keys_until_128_have_gathered():
    t = torch.tensor([0, 126, 127, 128, 254, 255, -3])
    assert kivi.cutoffs(t).tolist() == [0, 0, 128, 128, 128, 256, 0]
