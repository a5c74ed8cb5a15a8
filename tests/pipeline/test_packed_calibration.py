"""Packed calibration: samples sharing a row must see exactly what they see alone."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.arch.table import ARCHITECTURES
from quantkit.pipeline import make_chunks, pack_rows

from arch_configs import tiny_config


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_packed_rows_equal_samples_alone(arch):
    from transformers import AutoModelForCausalLM

    assert ARCHITECTURES[arch].packed_calibration
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32).eval()
    assert type(model).__name__ == arch
    rng = random.Random(1)
    samples = [[rng.randrange(1, 128) for _ in range(n)] for n in (20, 13, 7, 5, 16, 3, 9)]
    chunks = make_chunks(samples, batch_tokens=10_000)
    assert len(chunks) == 1 and chunks[0].valid is not None  # rows of 20 hold several samples
    c = chunks[0]
    with torch.no_grad():
        packed = model(input_ids=c.input_ids, position_ids=c.position_ids, use_cache=False).logits
        seen = 0
        for row in range(c.input_ids.shape[0]):
            at = 0
            while at < c.input_ids.shape[1] and bool(c.valid[row, at]):
                n = next((k for k in range(at + 1, c.input_ids.shape[1]) if int(c.position_ids[row, k]) == 0),
                         c.input_ids.shape[1])
                n = min(n, at + int(c.valid[row, at:].sum()))
                ids = c.input_ids[row, at:n]
                alone = model(input_ids=ids[None], use_cache=False).logits[0]
                torch.testing.assert_close(packed[row, at:n], alone, atol=1e-4, rtol=1e-4)
                seen += n - at
                at = n
        assert seen == sum(map(len, samples))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=40))
def test_pack_rows_places_every_sample_once_within_the_row(lengths):
    row_len = max(lengths)
    rows = pack_rows(lengths, row_len)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= row_len for r in rows)
    # first-fit decreasing never uses more than 11/9 OPT + 1 rows; OPT >= total / row_len
    assert len(rows) <= 11 / 9 * (sum(lengths) / row_len) + 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 32), min_size=1, max_size=30), st.integers(1, 200), st.booleans())
def test_chunks_hold_every_token_once_and_respect_the_budget(lengths, budget, packed):
    samples = [[1000 * i + k for k in range(n)] for i, n in enumerate(lengths)]
    chunks = make_chunks(samples, budget, packed=packed)
    tokens = []
    for c in chunks:
        rows, width = c.input_ids.shape
        assert rows == 1 or rows * width <= budget
        ids = c.input_ids[c.valid] if c.valid is not None else c.input_ids.reshape(-1)
        tokens += ids.tolist()
        assert c.num_tokens == ids.numel()
        if c.position_ids is not None:
            # positions restart at 0 exactly where a sample (or the padding tail) starts
            starts = (c.position_ids == 0)
            for r in range(rows):
                for k in range(width):
                    if c.valid is None or bool(c.valid[r, k]):
                        v = int(c.input_ids[r, k])
                        assert bool(starts[r, k]) == (v % 1000 == 0)
    assert sorted(tokens) == sorted(t for s in samples for t in s)


def test_empty_sample_is_an_error():
    from quantkit.errors import QuantkitError

    with pytest.raises(QuantkitError, match="no tokens"):
        make_chunks([[1, 2], []], 100)
