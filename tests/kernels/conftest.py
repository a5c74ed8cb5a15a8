"""Kernel tests run the Triton kernels under TRITON_INTERPRET=1 on CPU tensors.

The interpreter is chosen when ``@triton.jit`` runs, so the variable is set here, before any
test imports ``quantkit.kernels``' Triton modules (the registry imports them lazily). With a
GPU (and no TRITON_INTERPRET in the environment) the same tests run the compiled kernels.
"""

import os
import sys

import pytest
import torch

_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
_EARLY = []
if not _ON_GPU:
    # Already "1" (the root conftest.py sets it before collection): modules imported earlier, such
    # as by the doctests of quantkit/, were imported under the interpreter too.
    if os.environ.get("TRITON_INTERPRET") != "1":
        _EARLY = [m for m in ("quantkit.kernels.int4_gemm", "quantkit.kernels.fp8_gemm") if m in sys.modules]
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session", autouse=True)
def _interpreter_active():
    if _EARLY:
        pytest.fail(f"{_EARLY} imported before tests/kernels/conftest.py set TRITON_INTERPRET=1: "
                    "set it in the repository's root conftest.py")
