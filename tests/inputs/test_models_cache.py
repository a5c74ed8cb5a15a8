"""Unpacking the default model: a folder left by a killed unpacking goes, a live one stays."""

from __future__ import annotations

import os
import subprocess

import pytest

from quantkit.inputs import embedded_model as models
from quantkit.formats.staging import Owner


def test_unpacking_clears_dead_staging_folders_and_its_own(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    gguf = tmp_path / "wheel"
    gguf.mkdir()
    (gguf / models._GGUF_FILE).write_bytes(b"GGUF")
    monkeypatch.setattr(models, "_gguf_folder", lambda: gguf)

    def stop(*a, **k):   # the unpacking fails (as a kill would stop it) after its folder exists
        raise RuntimeError("stopped")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop)
    p = subprocess.Popen(["true"])
    p.wait()
    host = Owner.current().host
    dead = tmp_path / f".smollm2-{host}-{p.pid}-0a1b2c3d"
    live = tmp_path / f".smollm2-{host}-{os.getpid()}-0a1b2c3d"
    for f in (dead, live):
        f.mkdir()
    with pytest.raises(RuntimeError, match="stopped"):
        models.default_model_dir()
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "wheel"])   # its own went too
