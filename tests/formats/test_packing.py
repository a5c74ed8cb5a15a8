import pytest
import torch
from hypothesis import given, settings, strategies as st

from quantkit.formats.packing import pack_int32, packed_cols, unpack_int32


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 70), bits=st.sampled_from([2, 4, 8]),
       dim=st.sampled_from([0, 1]), seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip(rows, cols, bits, dim, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (rows, cols), generator=g).to(torch.int8)
    p = pack_int32(q, bits, dim)
    assert p.dtype == torch.int32
    expect = (packed_cols(rows, bits), cols) if dim == 0 else (rows, packed_cols(cols, bits))
    assert tuple(p.shape) == expect
    assert torch.equal(unpack_int32(p, bits, (rows, cols), dim), q)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 20), cols=st.integers(1, 50), bits=st.sampled_from([2, 4, 8]),
       dim=st.sampled_from([0, 1]), seed=st.integers(0, 2**16))
def test_identical_to_compressed_tensors(rows, cols, bits, dim, seed):
    import compressed_tensors.compressors.pack_quantized.helpers as ct
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (rows, cols), generator=g).to(torch.int8)
    assert torch.equal(pack_int32(q, bits, dim), ct.pack_to_int32(q, bits, packed_dim=dim))


def test_4bit_layout_is_low_nibble_first():
    q = torch.tensor([[-8, -7, 0, 7, 1, 2, 3, 4]], dtype=torch.int8)
    word = int(pack_int32(q, 4)[0, 0]) & 0xFFFFFFFF
    nibbles = [(word >> (4 * i)) & 0xF for i in range(8)]
    assert nibbles == [0, 1, 8, 15, 9, 10, 11, 12]


def test_rejects_unpackable_widths():
    with pytest.raises(ValueError, match="num_bits"):
        pack_int32(torch.zeros(2, 8, dtype=torch.int8), 9)
    with pytest.raises(ValueError, match="int8"):
        pack_int32(torch.zeros(2, 8, dtype=torch.int32), 4)


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("dim", [0, 1])
def test_every_width_packs_as_compressed_tensors_packs(bits, dim):
    """Dense packing: 3-, 5-, 6-, 7-bit codes straddle words exactly as the reference packs them."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    g = torch.Generator().manual_seed(bits)
    for shape in [(5, 37), (64, 96), (3, 1)]:
        codes = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), shape, generator=g).to(torch.int8)
        ours = pack_int32(codes, bits, dim=dim)
        assert torch.equal(ours, pack_to_int32(codes, bits, packed_dim=dim))
        assert torch.equal(unpack_int32(ours, bits, shape, dim=dim), codes)
        assert torch.equal(unpack_from_int32(ours, bits, torch.Size(shape), packed_dim=dim), codes)
