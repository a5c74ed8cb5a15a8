"""Benchmark the Triton GEMM kernels against torch's dense matmul on a CUDA GPU.

Per shape (M in 1, 16, 128, 2048; K x N in 4096x4096, 8192x8192, 8192x28672) it prints, for
W4A16 (fp16, group 128), FP8 W8A8 (bf16, dynamic per token, quantization included) and INT8
W8A8 (bf16, likewise): time, TFLOP/s, GB/s, the speed-up over torch's dense fp16/bf16
matmul, and the fraction of the memory-bandwidth limit (nominal H200 4.8 TB/s, and a
measured device-to-device copy as the practical ceiling). The targets are checked:
W4A16 >= 3x fp16 and >= 70% of bandwidth for M <= 16; FP8 >= 1.6x bf16 for M >= 2048.

    python benchmarks/kernel_bench.py                    # CUDA; a markdown table on stdout
    python benchmarks/kernel_bench.py --markdown out.md  # also write the table to a file
    python benchmarks/kernel_bench.py --json out.json    # also write the rows (and the device) as JSON
    python benchmarks/kernel_bench.py --interpret        # no GPU: tiny interpreter smoke run
    python benchmarks/kernel_bench.py --dry-run --m 1 16 --shapes 256x128 --json out.json
                                                    # no GPU: the table's own code path on CPU
                                                    # tensors under the interpreter

The dry run times with the wall clock against torch's CPU matmul: its figures check the
table and the JSON (benchmarks/gpu_check.sh --dry-run), not speed. Without CUDA (and
without --interpret or --dry-run) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

M_VALUES = (1, 16, 128, 2048)
KN_VALUES = ((4096, 4096), (8192, 8192), (8192, 28672))
NOMINAL_BW = 4.8e12  # H200 HBM3e, bytes/s
W4_GROUP = 128


def copy_bandwidth(torch, timer, device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), the practical ceiling."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


def make_timer(torch, triton, graph: bool):
    """``timer(fn) -> ms``: one untimed call (autotuning, compilation), then CUDA-graph replays
    (kernel time without Python launch overhead, as a serving engine runs decode) or launches."""
    def timer(fn):
        fn()
        torch.cuda.synchronize()
        if graph:
            try:
                return triton.testing.do_bench_cudagraph(fn)
            except Exception as exc:  # capture can fail on some setups: fall back, say so
                print(f"(cuda graph capture failed: {str(exc).splitlines()[0]}; timing launches)", flush=True)
        return triton.testing.do_bench(fn)
    return timer


def wall_timer(fn, reps: int = 3) -> float:
    """``ms`` of ``fn`` by the wall clock (median of ``reps`` after one untimed call): the dry run's timer."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_table(args, device: str = "cuda", on_row=None) -> tuple[dict, list[dict]]:
    """``(meta, rows)``: the table on CUDA, or (``device="cpu"``, interpreter on) its dry run;
    ``on_row(meta, rows)`` after each row (so a run cut short by a time limit keeps its rows)."""
    import torch
    import triton

    from quantkit.kernels import fp8_gemm, int4_gemm, int8_gemm

    if device == "cuda":
        timer = make_timer(torch, triton, not args.no_graph)
        copy_bw = copy_bandwidth(torch, triton.testing.do_bench)
        name, timing = torch.cuda.get_device_name(), "launches" if args.no_graph else "CUDA graphs"
    else:
        timer = wall_timer
        copy_bw = copy_bandwidth(torch, timer, "cpu", 1 << 26)
        name, timing = f"CPU ({platform.machine()}), TRITON_INTERPRET=1", "wall clock (dry run: not GPU figures)"
    meta = {"device": name, "torch": torch.__version__, "triton": triton.__version__, "timing": timing,
            "copy_bandwidth_gbs": copy_bw / 1e9, "nominal_bandwidth_gbs": NOMINAL_BW / 1e9, "w4_group": W4_GROUP}
    print(f"device: {name}; torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth {copy_bw / 1e9:.0f} GB/s ({copy_bw / NOMINAL_BW:.0%} of nominal "
          f"{NOMINAL_BW / 1e12:.1f} TB/s); timing: {timing}", flush=True)
    print(HEADER, flush=True)
    rows = []
    for k, n in args.shapes:
        dense_w = {dt: torch.randn(n, k, device=device).to(dt) for dt in (torch.float16, torch.bfloat16)}
        for m in args.m:
            dense_ms = {}
            for dt, w in dense_w.items():
                x = torch.randn(m, k, device=device).to(dt)
                dense_ms[dt] = timer(lambda: torch.matmul(x, w.t()))
            for name, mod, dt in (("W4A16", int4_gemm, torch.float16), ("FP8", fp8_gemm, torch.bfloat16),
                                  ("INT8", int8_gemm, torch.bfloat16)):
                t0 = time.perf_counter()
                r = mod.bench(m, n, k, dt, timer=timer, device=device) if name != "W4A16" else \
                    mod.bench(m, n, k, dt, W4_GROUP, timer=timer, device=device)
                bw = r["bytes"] / (r["ms"] * 1e-3)
                row = {"kernel": name, "M": m, "K": k, "N": n, "ms": r["ms"],
                       "tflops": r["flops"] / (r["ms"] * 1e-3) / 1e12, "gbs": bw / 1e9,
                       "dense_ms": dense_ms[dt], "speedup": dense_ms[dt] / r["ms"],
                       "bw_nominal": bw / NOMINAL_BW, "bw_copy": bw / copy_bw,
                       "dense": "fp16" if dt == torch.float16 else "bf16", "tune_s": time.perf_counter() - t0}
                row["target"] = _target(row) if device == "cuda" else "n/a (dry run)"
                rows.append(row)
                print(_line(row), flush=True)
                if on_row is not None:
                    on_row(meta, rows)
        del dense_w
        if device == "cuda":
            torch.cuda.empty_cache()
    return meta, rows


def _target(row) -> str:
    if row["kernel"] == "W4A16" and row["M"] <= 16:
        ok = row["speedup"] >= 3 and row["bw_nominal"] >= 0.7
        return ("met" if ok else "MISSED") + " (>=3x, >=70% BW)"
    if row["kernel"] == "FP8" and row["M"] >= 2048:
        return ("met" if row["speedup"] >= 1.6 else "MISSED") + " (>=1.6x)"
    return ""


HEADER = ("| kernel | M | K x N | ms | TFLOP/s | GB/s | vs dense | dense ms | BW (nominal) | BW (copy) | target |\n"
          "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")


def _line(r) -> str:
    return (f"| {r['kernel']} | {r['M']} | {r['K']}x{r['N']} | {r['ms']:.4f} | {r['tflops']:.1f} | {r['gbs']:.0f} | "
            f"{r['speedup']:.2f}x {r['dense']} | {r['dense_ms']:.4f} | {r['bw_nominal']:.0%} | {r['bw_copy']:.0%} | "
            f"{r['target']} |")


def run_interpret() -> None:
    """Tiny shapes through the interpreter against the torch references (correctness, not speed)."""
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' @triton.jit runs
    import torch

    from quantkit.kernels import fp8_gemm, int4_gemm, int8_gemm

    print("interpreter smoke run (CPU, TRITON_INTERPRET=1): times are not GPU figures")
    for m in (1, 16, 40):
        n, k = 96, 256
        x, packed, scale, zp = int4_gemm.make_random(m, n, k, torch.float16, "cpu", 64, symmetric=False)
        weight = int4_gemm.PackedWeight(packed, scale, zp, None, (n, k), 4, 64)
        w = int4_gemm.repack(weight)
        t0 = time.perf_counter()
        out = int4_gemm.w4a16_gemm(x, w)
        dt = time.perf_counter() - t0
        ref = int4_gemm.w4a16_reference(x, weight)
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        print(f"W4A16 M={m:3d} {k}x{n}: {dt * 1e3:7.1f} ms, rel. error vs reference {err:.1e}")
        for name, mod, gemm, reference in (("FP8", fp8_gemm, fp8_gemm.fp8_gemm, fp8_gemm.fp8_gemm_reference),
                                           ("INT8", int8_gemm, int8_gemm.int8_gemm, int8_gemm.int8_gemm_reference)):
            xa, wq, sw = mod.make_random(m, n, k, torch.bfloat16, "cpu")
            t0 = time.perf_counter()
            out = gemm(xa, wq, sw)
            dt = time.perf_counter() - t0
            ref = reference(xa, wq, sw)
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            print(f"{name:5s} M={m:3d} {k}x{n}: {dt * 1e3:7.1f} ms, rel. error vs reference {err:.1e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--interpret", action="store_true", help="no GPU: a tiny interpreter smoke run")
    p.add_argument("--m", type=int, nargs="+", default=list(M_VALUES))
    p.add_argument("--shapes", type=lambda s: tuple(int(v) for v in s.lower().split("x")), nargs="+",
                   default=list(KN_VALUES), help="K x N pairs, e.g. 4096x4096")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: the table on CPU tensors under the interpreter (figures check the code, not speed)")
    p.add_argument("--markdown", help="also write the table to this file")
    p.add_argument("--json", help="also write the rows and the device as JSON to this file")
    p.add_argument("--no-graph", action="store_true", help="time plain launches instead of CUDA-graph replays")
    args = p.parse_args(argv)
    if args.interpret:
        run_interpret()
        return 0
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' @triton.jit runs
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("benchmarks/kernel_bench.py needs a CUDA GPU (none found); --interpret runs a tiny CPU smoke test")
        return 0
    def write(meta, rows):
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write("\n".join([HEADER] + [_line(r) for r in rows]) + "\n")
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    run_table(args, "cpu" if args.dry_run else "cuda", on_row=write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
