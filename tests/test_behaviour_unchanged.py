"""Every tensor the round-to-nearest recipes write on a tiny seeded Llama is bit-identical to what
the reference version wrote (``golden/rtn_tensors.json``, made by ``golden/tensor_digests.py`` with
quantkit before its packages were reorganised). A change meant to keep behaviour must keep these."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_rtn_recipes_write_the_reference_bytes(tmp_path):
    out = tmp_path / "digests.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    res = subprocess.run([sys.executable, str(HERE / "golden" / "tensor_digests.py"), str(out)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    want = json.loads((HERE / "golden" / "rtn_tensors.json").read_text())
    assert set(got) == set(want)
    for recipe in want:
        differ = sorted(n for n in set(want[recipe]) | set(got[recipe]) if want[recipe].get(n) != got[recipe].get(n))
        assert not differ, f"{recipe}: {len(differ)} tensors differ, e.g. {differ[:3]}"
