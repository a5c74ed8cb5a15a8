"""benchmarks/kernel_bench.py: the no-GPU paths (the CUDA table needs a GPU) and GPU-only checks."""

import importlib.util
from pathlib import Path

import pytest
import torch

from kernel_testing import DEVICE, REL_TOL, rel_err

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_bench.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed without a GPU")
def test_without_gpu_says_so_and_exits_0(capsys):
    assert _bench_module().main([]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.skipif(DEVICE == "cuda", reason="interpreter smoke run")
def test_interpret_smoke_run(capsys):
    assert _bench_module().main(["--interpret"]) == 0
    out = capsys.readouterr().out
    errors = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "rel. error" in line]
    assert len(errors) == 9 and max(errors) < REL_TOL[torch.float16]


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (compiled, autotuned kernels)")
@pytest.mark.parametrize("m", [1, 16, 300])
def test_gpu_autotuned_realistic_shape(m):
    from quantkit.kernels import fp8_gemm, int4_gemm, int8_gemm

    n, k = 4096, 4096
    x, packed, scale, zp = int4_gemm.make_random(m, n, k, torch.float16, "cuda", 128, symmetric=False)
    weight = int4_gemm.PackedWeight(packed, scale, zp, None, (n, k), 4, 128)
    w = int4_gemm.repack(weight)
    ref = int4_gemm.w4a16_reference(x, weight)
    assert rel_err(int4_gemm.w4a16_gemm(x, w), ref) < REL_TOL[torch.float16]
    for mod, gemm, reference in ((fp8_gemm, fp8_gemm.fp8_gemm, fp8_gemm.fp8_gemm_reference),
                                 (int8_gemm, int8_gemm.int8_gemm, int8_gemm.int8_gemm_reference)):
        xa, wq, sw = mod.make_random(m, n, k, torch.bfloat16, "cuda")
        assert rel_err(gemm(xa, wq, sw), reference(xa, wq, sw)) < REL_TOL[torch.bfloat16]
