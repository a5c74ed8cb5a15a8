"""Model-free conversion: peak memory against checkpoint size, time, and llm-compressor's peer.

Builds a random fp32 Llama checkpoint (streamed to disk shard by shard) at least 3x a memory cap,
converts it with ``quantize_model_free`` in a fresh process inside a cgroup v1 memory cap (peak
RSS from the child's VmHWM, OOM kills from the cgroup), again uncapped, and with a checkpoint of
half the depth (the peak should not move). For each recipe the model path (``quantkit.quantize``)
runs too, uncapped, for its time and peak. With ``--llmc-python`` (a venv holding llm-compressor,
e.g. ``python -m venv /tmp/llmc && /tmp/llmc/bin/pip install torch==2.13.0 'llmcompressor==0.14.*'``),
its ``model_free_ptq`` converts the same checkpoints (and the embedded SmolLM2 with ``--smollm2``),
and the tensors both write are compared bit for bit.

    OMP_NUM_THREADS=1 python benchmarks/model_free.py [--layers 26] [--hidden 1024] [--cap-mib 512]
        [--recipes w8a16,fp8-dynamic,nvfp4a16] [--llmc-python /tmp/llmc/bin/python] [--smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")

CHILD = r"""
import json, sys, time
mode, src, out, recipe = sys.argv[1:5]
t = time.time()
if mode == "model-free":
    from quantkit.workflows.model_free import quantize_model_free
    quantize_model_free(src, recipe).save(out)
elif mode == "model-path":
    import quantkit
    quantkit.quantize(src, recipe).save(out)
else:
    from compressed_tensors.quantization import QuantizationScheme
    from llmcompressor import model_free_ptq
    # the scheme quantkit wrote (recipe: its config.json), not llm-compressor's preset of the same
    # name (its W8A16 is group 128, quantkit's per channel); norms are left out by llm-compressor
    # itself, the embeddings and the head as quantkit leaves them
    group = json.load(open(recipe))["quantization_config"]["config_groups"]["group_0"]
    model_free_ptq(src, out, scheme=QuantizationScheme.model_validate(group),
                   ignore=["lm_head", "re:.*embed_tokens$"], device="cpu")
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"peak_rss": hwm * 1024, "seconds": time.time() - t}))
"""


def run(python: str, mode: str, src: Path, out: Path, recipe: str, cap: int | None = None) -> dict:
    """One conversion in a fresh process (inside a cgroup capped at ``cap`` bytes when given)."""
    group = None
    if cap is not None:
        group = CGROUP_ROOT / f"quantkit-bench-{os.getpid()}-{time.monotonic_ns()}"
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(cap))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(cap))
    join = None if group is None else (lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    try:
        res = subprocess.run([python, "-c", CHILD, mode, str(src), str(out), recipe], capture_output=True, text=True,
                             preexec_fn=join, env=env, timeout=3600)
        result = {"rc": res.returncode}
        if res.returncode == 0:
            result.update(json.loads(res.stdout.strip().splitlines()[-1]))
        else:
            result["error"] = [line for line in res.stderr.strip().splitlines() if line.strip()][-1:]
        if group is not None:
            oom = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
            result["oom_kills"] = int(oom.get("oom_kill", 0))
        return result
    finally:
        if group is not None:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def compare(a: Path, b: Path) -> dict:
    """Tensors both checkpoints hold: how many are equal bit for bit; the names only one holds."""
    import torch
    from safetensors import safe_open

    def index(folder: Path) -> dict[str, Path]:
        return {k: f for f in sorted(folder.glob("*.safetensors")) for k in safe_open(f, "pt").keys()}

    ia, ib = index(a), index(b)
    equal, differ = 0, []
    for k in sorted(set(ia) & set(ib)):
        with safe_open(ia[k], "pt") as fa, safe_open(ib[k], "pt") as fb:
            x, y = fa.get_tensor(k), fb.get_tensor(k)
        same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.reshape(-1).view(torch.uint8),
                                                                          y.reshape(-1).view(torch.uint8))
        equal += same
        if not same:
            differ.append(k)
    return {"common": len(set(ia) & set(ib)), "equal": equal, "differ_first": differ[:3],
            "only_quantkit": sorted(set(ia) - set(ib))[:3], "only_other": sorted(set(ib) - set(ia))[:3]}


def measure(args, root: Path) -> dict:
    from model_factory import make_streamed_llama_dir

    deep = make_streamed_llama_dir(root / "deep", args.layers, args.hidden, vocab=args.vocab, shard_bytes=200e6)
    shallow = make_streamed_llama_dir(root / "shallow", args.layers // 2, args.hidden, vocab=args.vocab,
                                      shard_bytes=200e6)
    size = sum(f.stat().st_size for f in deep.glob("*.safetensors"))
    cap = args.cap_mib * 2**20
    report = {"checkpoint_bytes": size, "cap_bytes": cap, "largest_tensor_bytes": args.hidden * 4 * args.hidden * 4,
              "layers": args.layers, "hidden": args.hidden, "recipes": {}}
    for recipe in args.recipes.split(","):
        r = report["recipes"][recipe] = {}
        out = root / recipe
        r["capped"] = run(sys.executable, "model-free", deep, out / "capped", recipe, cap)
        r["uncapped"] = run(sys.executable, "model-free", deep, out / "free", recipe)
        r["half_depth"] = run(sys.executable, "model-free", shallow, out / "shallow", recipe)
        r["model_path"] = run(sys.executable, "model-path", deep, out / "path", recipe)
        r["model_path_equal"] = compare(out / "free", out / "path")
        if args.llmc_python:
            r["llmc"] = run(args.llmc_python, "llmc", deep, out / "llmc", str(out / "free" / "config.json"))
            r["llmc_equal"] = compare(out / "free", out / "llmc") if r["llmc"]["rc"] == 0 else None
        print(json.dumps({recipe: r}), file=sys.stderr)
    return report


def smollm2(args, root: Path) -> dict:
    """quantkit's model-free output against llm-compressor's on the embedded SmolLM2."""
    from quantkit.inputs.embedded_model import default_model_dir

    src, out = default_model_dir(), {}
    for recipe in args.recipes.split(","):
        ours = run(sys.executable, "model-free", src, root / f"smol-{recipe}", recipe)
        theirs = run(args.llmc_python, "llmc", src, root / f"smol-llmc-{recipe}",
                     str(root / f"smol-{recipe}" / "config.json"))
        out[recipe] = {"quantkit": ours, "llmc": theirs,
                       "equal": compare(root / f"smol-{recipe}", root / f"smol-llmc-{recipe}") if theirs["rc"] == 0
                       else None}
        print(json.dumps({f"smollm2 {recipe}": out[recipe]}), file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--cap-mib", type=int, default=512)
    p.add_argument("--recipes", default="w8a16,fp8-dynamic,nvfp4a16")
    p.add_argument("--llmc-python", default=None, help="the Python of a venv holding llm-compressor")
    p.add_argument("--smollm2", action="store_true", help="also compare with llm-compressor on SmolLM2")
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="model-free-bench-") as tmp:
        report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                  "synthetic": measure(args, Path(tmp))}
        if args.smollm2 and args.llmc_python:
            report["smollm2"] = smollm2(args, Path(tmp))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
