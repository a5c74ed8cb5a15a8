"""The GPU path compiles for an H100/H200 (sm_90) and uses its tensor cores, checked without a GPU.

Triton ships ptxas, so kernels compile ahead of time for a named target. This runs in a
subprocess without TRITON_INTERPRET (the test session's kernels are interpreted ones) and
specializes the arguments as a real launch would (16-divisible sizes, unit strides).
"""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import re, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from quantkit.kernels import act_quant, fp8_gemm, int4_gemm, int8_gemm

    UNIT = ("stride_xk", "stride_qn", "stride_sn", "stride_on", "stride_ak", "stride_wk")

    def build(fn, ptrs, consts, warps=4, stages=3):
        consts = dict(consts)
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in consts:
                sig[name] = "constexpr"
            elif name in UNIT:
                sig[name] = "constexpr"
                consts[name] = 1
            elif name in ptrs:
                sig[name] = ptrs[name]
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                sig[name] = "i32"
                if name not in ("M", "M_BUCKET"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
        return k.asm["ptx"]

    def w4(x_dt, cfg, **flags):
        c = dict(cfg.kwargs)
        ptrs = {"x_ptr": "*" + x_dt, "qw_ptr": "*i32", "s_ptr": "*" + x_dt, "z_ptr": "*i32", "g_ptr": "*i32",
                "b_ptr": "*" + x_dt, "out_ptr": "*fp32" if c["SPLIT_K"] > 1 else "*" + x_dt}
        return build(int4_gemm._w4a16_kernel, ptrs, dict(BITS=4, HAS_BIAS=False, COMPUTE_F32=False, **flags, **c),
                     cfg.num_warps, cfg.num_stages)

    def w8(fn, cfg, a_dt, w_dt):
        ptrs = {"a_ptr": "*" + a_dt, "w_ptr": "*" + w_dt, "sa_ptr": "*fp32", "sw_ptr": "*fp32", "b_ptr": "*bf16",
                "out_ptr": "*bf16"}
        flags = dict(A_QUANT=True, PER_TOKEN=True, PER_CHANNEL=True, HAS_BIAS=True, COMPUTE_F32=False)
        return build(fn, ptrs, dict(flags, **cfg.kwargs), cfg.num_warps, cfg.num_stages)

    ptx = {
        "w4-decode": w4("fp16", int4_gemm.DECODE_CONFIGS[1], HAS_ZP=True, HAS_GIDX=False, GROUP_TILE=True),
        "w4-prefill": w4("bf16", int4_gemm.PREFILL_CONFIGS[0], HAS_ZP=False, HAS_GIDX=True, GROUP_TILE=False),
        "fp8": w8(fp8_gemm._fp8_gemm_kernel, fp8_gemm.CONFIGS[4], "fp8e4nv", "fp8e4nv"),
        "int8": w8(int8_gemm._int8_gemm_kernel, int8_gemm.CONFIGS[4], "i8", "i8"),
        "act-quant": build(act_quant._act_quant_kernel, {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"},
                           dict(STATIC=False, INT8=False, LIMIT=448.0, MIN_SCALE=1 / (448 * 512), BLOCK=1024)),
    }
    for name, text in ptx.items():
        print(name, "wgmma" if "wgmma.mma_async" in text else "", "mma" if "mma.sync" in text else "",
              "e4m3" if re.search(r"wgmma[^\\n]*e4m3", text) else "", "s8" if re.search(r"wgmma[^\\n]*s8", text) else "",
              "vec16" if re.search(r"cp\\.async[^\\n]*0x10", text) else "", "atom" if "atom.global" in text else "")
''')


def _nvidia_backend_available() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _nvidia_backend_available(), reason="triton without its NVIDIA backend")
def test_kernels_compile_for_sm90_with_tensor_cores():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = {line.split()[0]: set(line.split()[1:]) for line in res.stdout.splitlines() if line.strip()}
    assert {"mma", "vec16", "atom"} <= got["w4-decode"]   # split-K GEMV tile: mma.sync, 16-byte loads
    assert "wgmma" in got["w4-prefill"]                   # Hopper warpgroup MMA, g_idx path
    assert {"wgmma", "e4m3"} <= got["fp8"]                # fp8 tensor cores
    assert {"wgmma", "s8"} <= got["int8"]                 # int8 tensor cores
    assert "act-quant" in got
