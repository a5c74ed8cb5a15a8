"""Shared numbers for the kernel tests (conftest.py has already chosen the interpreter)."""

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

# Relative Frobenius error allowed against the torch reference, per output dtype: kernel and
# reference each round the output once, and sum in a different order in fp32.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))
