"""Peak memory of `quantkit convert` against model depth (issue 2, acceptance 3).

Builds two random-initialised Llama checkpoints of the same width, one with twice the layers
of the other, converts each in a fresh process, and reports the peak resident memory
(ru_maxrss of the child) as the median of several runs. The layer-by-layer pipeline should
peak at about the same memory for both (target: deep / shallow <= 1.15). As a peer, the same
kind of process loads the full model with transformers and makes its weights resident (what a
whole-model quantizer holds while it works); its peak grows with depth. (transformers' lazy
load alone maps the files without reading them, so it is not a useful peer.)

    python benchmarks/memory.py [--layers 6] [--hidden 1024] [--runs 3] [--recipe w8a16]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def make_checkpoint(path: Path, layers: int, hidden: int, vocab: int = 32000) -> Path:
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLM"]
    path.mkdir(parents=True)
    cfg.save_pretrained(path)
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (hidden, hidden),
                       p + "self_attn.v_proj.weight": (hidden, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (4 * hidden, hidden), p + "mlp.up_proj.weight": (4 * hidden, hidden),
                       p + "mlp.down_proj.weight": (hidden, 4 * hidden)})
    shard, size, n, index = {}, 0, 0, {}
    names = list(shapes)
    for k in names:
        t = torch.ones(shapes[k]) if k.endswith("norm.weight") else torch.randn(shapes[k], generator=g) * 0.02
        shard[k] = t
        size += t.numel() * 4
        if size > 400e6 or k == names[-1]:
            n += 1
            fname = f"part-{n:03d}.safetensors"
            save_file(shard, str(path / fname), metadata={"format": "pt"})
            index.update({key: fname for key in shard})
            shard, size = {}, 0
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return path


CHILD = r"""
import json, resource, sys, time
mode, src, out, recipe = sys.argv[1:5]
t = time.time()
if mode == "quantkit":
    import quantkit
    q = quantkit.quantize(src, recipe, calibration=[[1, 2, 3, 4] * 32] * 8)
    q.save(out)
else:
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    for p in m.parameters():
        p.data = p.data.clone()
print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "seconds": time.time() - t}))
"""


def measure(mode: str, src: Path, recipe: str, runs: int, tmp: Path) -> dict:
    peaks, secs = [], []
    for r in range(runs):
        out = tmp / f"out-{mode}-{src.name}-{r}"
        res = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out), recipe],
                             capture_output=True, text=True, check=True)
        d = json.loads(res.stdout.strip().splitlines()[-1])
        peaks.append(d["peak_rss"])
        secs.append(d["seconds"])
    return {"peak_rss": statistics.median(peaks), "seconds": statistics.median(secs), "all": peaks}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recipe", default="w8a16")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shallow = make_checkpoint(tmp / f"L{a.layers}", a.layers, a.hidden)
        deep = make_checkpoint(tmp / f"L{2 * a.layers}", 2 * a.layers, a.hidden)
        sizes = {p.name: sum(f.stat().st_size for f in p.glob("*.safetensors")) for p in (shallow, deep)}
        rows = {}
        for mode in ("quantkit", "whole-model"):
            rows[mode] = {p.name: measure(mode, p, a.recipe, a.runs, tmp) for p in (shallow, deep)}
    mib = 2**20
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, python {platform.python_version()}, torch {torch.__version__}")
    print(f"recipe {a.recipe}; hidden {a.hidden}; checkpoints: " + ", ".join(f"{k} {v / mib:.0f} MiB" for k, v in sizes.items()))
    print("| process | layers | peak RSS (median of %d) | seconds | deep/shallow |" % a.runs)
    print("| --- | --- | --- | --- | --- |")
    ratios = {}
    for mode, r in rows.items():
        s, dp = r[shallow.name], r[deep.name]
        ratios[mode] = dp["peak_rss"] / s["peak_rss"]
        print(f"| {mode} | {a.layers} | {s['peak_rss'] / mib:.0f} MiB | {s['seconds']:.1f} | |")
        print(f"| {mode} | {2 * a.layers} | {dp['peak_rss'] / mib:.0f} MiB | {dp['seconds']:.1f} | {ratios[mode]:.3f} |")
    ok = ratios["quantkit"] <= 1.15
    print(f"quantkit deep/shallow peak ratio {ratios['quantkit']:.3f} (target <= 1.15): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
