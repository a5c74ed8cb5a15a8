"""Every tensor quantkit writes on a tiny seeded model is bit-identical to what the reference
version wrote (``golden/*_tensors.json``, made by ``golden/tensor_digests.py`` with quantkit before
its packages were reorganised). A change meant to keep behaviour must keep these.

The GPTQ digests are stable because the script runs in a process of its own on one thread: every
matmul, Hessian fold and Cholesky factorisation then runs one fixed sequence of floating-point
operations. Two runs of the reference version gave identical digests; a different BLAS or CPU
kernel set may round differently, so on another machine regenerate them from the reference
commit rather than loosen the comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def written_digests(tmp_path: Path, suite: str) -> dict:
    out = tmp_path / "digests.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    res = subprocess.run([sys.executable, str(HERE / "golden" / "tensor_digests.py"), str(out), suite], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("suite", ["rtn", "gptq"])
def test_recipes_write_the_reference_bytes(tmp_path, suite):
    got = written_digests(tmp_path, suite)
    want = json.loads((HERE / "golden" / f"{suite}_tensors.json").read_text())
    assert set(got) == set(want)
    for recipe in want:
        differ = sorted(n for n in set(want[recipe]) | set(got[recipe]) if want[recipe].get(n) != got[recipe].get(n))
        assert not differ, f"{recipe}: {len(differ)} tensors or log entries differ, e.g. {differ[:3]}"
