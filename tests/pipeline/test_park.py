"""Parking a paused batch's tensors in a file (pipeline/park.py) and the lockstep pass that uses it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.pipeline import park as park_mod


def test_parked_tensors_lose_their_memory_and_come_back_equal(tmp_path, monkeypatch):
    monkeypatch.setattr(park_mod, "MIN_PARK_BYTES", 1024)
    a = torch.randn(256, 64)
    view = a.view(-1)                                  # the same storage: back with it
    b = torch.randn(64, 128).to(torch.bfloat16)
    small = torch.randn(8)                             # under the threshold: stays
    strided = torch.randn(128, 64).t()                 # not contiguous: stays
    part = torch.randn(512, 64)[:256]                  # a part of a storage: stays
    save_file({"x": torch.randn(256, 64)}, str(tmp_path / "f.safetensors"))
    mapped = load_file(str(tmp_path / "f.safetensors"))["x"]   # storage not resizable: stays
    copies = [t.clone() for t in (a, b, small, strided, part, mapped)]
    path = tmp_path / "parked.bin"
    restore = park_mod.park([a, view, b, None, small, strided, part, mapped], path)
    assert a.untyped_storage().nbytes() == 0 and b.untyped_storage().nbytes() == 0
    assert path.stat().st_size == a.numel() * 4 + b.numel() * 2
    for t in (small, strided, part, mapped):
        assert t.untyped_storage().nbytes() > 0
    restore()
    assert not path.exists()
    for t, c in zip((a, b, small, strided, part, mapped), copies):
        assert t.dtype == c.dtype and torch.equal(t, c)
    assert torch.equal(view, copies[0].view(-1))


def test_a_cut_parking_file_is_an_error_not_garbage(tmp_path, monkeypatch):
    monkeypatch.setattr(park_mod, "MIN_PARK_BYTES", 1024)
    a = torch.randn(256, 64)
    path = tmp_path / "parked.bin"
    restore = park_mod.park([a], path)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(RuntimeError, match="cut short"):
        restore()
