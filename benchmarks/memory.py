"""Peak memory of a conversion against model depth.

Builds two random-initialised Llama checkpoints of the same width, one with twice the layers
of the other, converts each in a fresh process with each recipe (RTN W4A16; GPTQ W4A16 g64
with ``calibration.offload`` on), and reports the peak resident memory (the child's VmHWM) as
the median of several runs. The layer-by-layer pipeline should peak at about the
same memory for both (target: deep / shallow <= 1.1). As a peer, the same kind of process
loads the full model with transformers and makes its weights resident (what a whole-model
quantizer holds while it works); its peak grows with depth. (transformers' lazy load alone
maps the files without reading them, so it is not a useful peer.)

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/memory.py [--layers 12] [--hidden 768]
        [--runs 3] [--recipes rtn,gptq] [--no-peer]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from model_factory import make_streamed_llama_dir  # noqa: E402

TARGET = 1.1


def recipes() -> dict[str, dict]:
    """The recipes measured: RTN W4A16, and GPTQ W4A16 g64 with its hidden states offloaded."""
    gptq = yaml.safe_load((ROOT / "recipes" / "w4a16-g64-gptq.yaml").read_text())
    gptq["calibration"] = {**gptq.get("calibration", {}), "offload": True}
    return {"rtn": {"version": 1, "scheme": "W4A16", "ignore": ["lm_head"], "algorithm": {"name": "rtn"}},
            "gptq": gptq}


def calibration(samples: int = 16, length: int = 256, vocab: int = 32000) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (samples, length), generator=g).tolist()


CHILD = r"""
import json, sys, time
mode, src, out, recipe, calib = sys.argv[1:6]
t = time.time()
if mode == "quantkit":
    import quantkit
    q = quantkit.quantize(src, json.loads(recipe), calibration=json.loads(calib))  # RTN: warned, unused
    q.save(out)
else:
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    for p in m.parameters():
        p.data = p.data.clone()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"peak_rss": hwm * 1024, "seconds": time.time() - t}))
"""
# VmHWM (this process's own peak), not ru_maxrss: ru_maxrss keeps the peak of the memory a process
# exec'd from, and subprocess execs the child from this script's, which built the models (measured:
# a child exec'd from a 1 GiB parent reported ru_maxrss 1037 MiB, VmHWM 13 MiB)


def measure(mode: str, src: Path, recipe: dict, runs: int, tmp: Path) -> dict:
    peaks, secs = [], []
    for r in range(runs):
        out = tmp / f"out-{mode}-{src.name}-{r}"
        res = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out), json.dumps(recipe),
                              json.dumps(calibration())], capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{mode} on {src.name} failed:\n{res.stderr[-3000:]}")
        d = json.loads(res.stdout.strip().splitlines()[-1])
        peaks.append(d["peak_rss"])
        secs.append(d["seconds"])
        subprocess.run(["rm", "-rf", str(out)], check=True)
    return {"peak_rss": statistics.median(peaks), "seconds": statistics.median(secs), "all": peaks}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12, help="the shallow model's depth; the deep one has twice")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recipes", default="rtn,gptq", help=f"comma-separated, of: {', '.join(recipes())}")
    ap.add_argument("--no-peer", action="store_true", help="skip the whole-model peer")
    a = ap.parse_args()
    chosen = {k: recipes()[k] for k in a.recipes.split(",")}
    modes = [(f"quantkit {k}", "quantkit", r) for k, r in chosen.items()]
    if not a.no_peer:
        modes.append(("whole model resident", "whole-model", {}))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shallow = make_streamed_llama_dir(tmp / f"L{a.layers}", a.layers, a.hidden)
        deep = make_streamed_llama_dir(tmp / f"L{2 * a.layers}", 2 * a.layers, a.hidden)
        sizes = {p.name: sum(f.stat().st_size for f in p.glob("*.safetensors")) for p in (shallow, deep)}
        rows = {label: {p.name: measure(mode, p, r, a.runs, tmp) for p in (shallow, deep)} for label, mode, r in modes}
    mib = 2**20
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, python {platform.python_version()}, "
          f"torch {torch.__version__}")
    print(f"hidden {a.hidden}, intermediate {4 * a.hidden}, vocab 32000, fp32; GPTQ calibration 16 x 256 tokens; "
          "checkpoints: " + ", ".join(f"{k} {v / mib:.0f} MiB" for k, v in sizes.items()))
    print(f"| process | layers | peak RSS (median of {a.runs}) | all runs (MiB) | seconds | deep/shallow |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratios = {}
    for label, r in rows.items():
        s, dp = r[shallow.name], r[deep.name]
        ratios[label] = dp["peak_rss"] / s["peak_rss"]
        for n, x, ratio in ((a.layers, s, ""), (2 * a.layers, dp, f"{ratios[label]:.3f}")):
            runs = " / ".join(f"{v / mib:.0f}" for v in x["all"])
            print(f"| {label} | {n} | {x['peak_rss'] / mib:.0f} MiB | {runs} | {x['seconds']:.1f} | {ratio} |")
    ok = True
    for label in (label for label, mode, _ in modes if mode == "quantkit"):
        passed = ratios[label] <= TARGET
        ok &= passed
        print(f"{label}: deep/shallow peak ratio {ratios[label]:.3f} (target <= {TARGET}): {'PASS' if passed else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
