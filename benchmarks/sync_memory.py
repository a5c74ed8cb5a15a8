"""Resident memory at each sync point of GPTQ's one-pass lockstep.

Runs ``quantkit.quantize`` on the embedded SmolLM2-135M with benchmarks/gptq.py's GPTQ setting
(W4A16 sym g64, act-order weight, min-max ranges) on ``--samples`` Lee-corpus windows of 512
tokens, and prints, when every batch is paused at a sync point and at each layer's end: the
anonymous resident memory, the C heap's bytes in use and free (glibc ``mallinfo2``), the bytes
in blocks that have maps of their own, and the process's ``ru_maxrss``. It stops after ``--layers``
layers. The tokenizer loads in the same process, so the baseline is higher than the benchmark's
worker's.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/sync_memory.py --layers 2 [--offload]
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def anon_mib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) // 1024
    return -1


class _Stop(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--offload", action="store_true", help="calibration.offload: true (paused batches parked)")
    a = ap.parse_args()
    import torch

    import quantkit
    import quantkit.pipeline.interleave as interleave

    sys.path.insert(0, str(HERE))
    import gptq as bench

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    torch.set_num_threads(a.threads)
    t0, layer = time.time(), [0]

    def line(what: str) -> str:
        m = libc.mallinfo2()
        return (f"layer {layer[0]} {what:24s} anon {anon_mib():5d} MiB  heap used {m.uordblks >> 20:5d}  "
                f"heap free {m.fordblks >> 20:5d}  own maps {m.hblkhd >> 20:5d}  "
                f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10:5d}  t {time.time() - t0:6.1f} s")

    sync, run = interleave.Interleaver.sync, interleave.Interleaver.run

    def traced_sync(self, key, action, on_pause=None):
        def traced():
            print(line(f"sync {key}"), flush=True)
            action()
        return sync(self, key, traced, on_pause)

    def traced_run(self, calls, before=None):
        run(self, calls, before)
        print(line("end of the pass"), flush=True)
        layer[0] += 1
        if layer[0] >= a.layers:
            raise _Stop

    interleave.Interleaver.sync, interleave.Interleaver.run = traced_sync, traced_run
    folder = bench.model_dir("smollm2")
    _, calib, _ = bench.heldout_and_calibration(bench.load_tokenizer(folder), 40, 512, a.samples, 0)
    recipe = {"version": 1, "config_groups": bench.scheme_dict(64, "weight", "minmax"), "ignore": ["lm_head"],
              "algorithm": {"name": "gptq"},
              "calibration": {"num_samples": len(calib), "max_seq_len": 512, "offload": a.offload}}
    print(line("before"), flush=True)
    with tempfile.TemporaryDirectory() as work:
        try:
            quantkit.quantize(folder, recipe, calib, quantkit.ConvertOptions(workdir=work))
        except _Stop:
            pass


if __name__ == "__main__":
    main()
