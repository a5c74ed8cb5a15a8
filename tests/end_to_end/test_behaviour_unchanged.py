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

HERE = Path(__file__).resolve().parents[1]   # tests/


def written_digests(tmp_path: Path, suite: str) -> dict:
    out = tmp_path / "digests.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    res = subprocess.run([sys.executable, str(HERE / "golden" / "tensor_digests.py"), str(out), suite], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


# GPTQ's digests per kind of host: its one-thread matmuls and factorisations round as the CPU's
# kernels do (torch's capability, the vendor's BLAS paths, AMX). Each file was made from a commit
# whose digests equal the reference version's on the host of the first file: gptq_tensors.json on
# an AMD EPYC (AVX-512, no AMX); the Intel one from 954acd8, which matched that file there.
GPTQ_GOLDEN = {"AuthenticAMD-AVX512": "gptq_tensors.json",
               "GenuineIntel-AVX512-amx": "gptq_tensors.intel-amx.json"}


def numeric_host() -> str:
    """What decides how this machine rounds GPTQ's floating point: CPU vendor, torch's CPU
    capability, AMX."""
    import torch

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vendor = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("vendor_id")), "unknown")
    amx = "amx_tile" in info.split()
    return f"{vendor}-{torch.backends.cpu.get_cpu_capability()}" + ("-amx" if amx else "")


def golden(suite: str) -> Path:
    if suite != "gptq":
        return HERE / "golden" / f"{suite}_tensors.json"   # elementwise: the same bits on every host
    host = numeric_host()
    if host not in GPTQ_GOLDEN:
        pytest.fail(f"no GPTQ digests for a {host} host: make them with tests/golden/tensor_digests.py from a "
                    "commit whose digests match on a host listed in GPTQ_GOLDEN, and add the file here")
    return HERE / "golden" / GPTQ_GOLDEN[host]


@pytest.mark.parametrize("suite", ["rtn", "gptq"])
def test_recipes_write_the_reference_bytes(tmp_path, suite):
    got = written_digests(tmp_path, suite)
    want = json.loads(golden(suite).read_text())
    assert set(got) == set(want)
    for recipe in want:
        differ = sorted(n for n in set(want[recipe]) | set(got[recipe]) if want[recipe].get(n) != got[recipe].get(n))
        assert not differ, f"{recipe}: {len(differ)} tensors or log entries differ, e.g. {differ[:3]}"
