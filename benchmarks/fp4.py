"""FP4 benchmark: NVFP4 and MXFP4 on SmolLM2, held-out perplexity of each recipe.

The held-out text and calibration windows are benchmarks/gptq.py's (the Lee corpus: its first
``--eval-windows`` windows of ``--seq-len`` tokens held out, calibration windows at seeded offsets
in the rest). Each recipe is converted by quantkit and read back by ``quantkit.load`` (the torch
reference: FP4 weights dequantized, FP4 activations emulated per token group), then scored.

Usage:
    python benchmarks/fp4.py --samples 32 --eval-windows 20
    python benchmarks/fp4.py --recipes nvfp4a16,nvfp4a16-gptq --json fp4.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gptq import heldout_and_calibration, load_tokenizer, model_dir, perplexity  # noqa: E402

RECIPES = ("nvfp4a16", "nvfp4a16-gptq", "nvfp4", "mxfp4a16", "mxfp4")


def score(folder: Path, recipe: str, calib: list[list[int]], seq_len: int, held, bos, workdir: Path) -> dict:
    """Convert ``folder`` with ``recipe`` (its calibration: ``calib``), reload, score the held-out text."""
    import quantkit

    rec = quantkit.load_recipe(recipe).to_dict()
    rec["calibration"] = {**rec.get("calibration", {}), "num_samples": len(calib), "max_seq_len": seq_len}
    t0 = time.perf_counter()
    q = quantkit.quantize(folder, rec, calib, quantkit.ConvertOptions(workdir=str(workdir / recipe)))
    seconds = time.perf_counter() - t0
    log = json.loads((q.path / "quantization_log.json").read_text())["modules"].values()
    ratios = [m["loss_vs_rtn"] for m in log if m.get("loss_vs_rtn") is not None]
    return {"perplexity": perplexity(q.load(), held, bos), "convert_seconds": round(seconds, 1),
            "gptq_loss_vs_rtn_mean": sum(ratios) / len(ratios) if ratios else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3, or a local HF folder")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated shipped recipe names")
    ap.add_argument("--samples", type=int, default=32, help="calibration windows")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    folder = model_dir(a.model)
    held, calib, bos = heldout_and_calibration(load_tokenizer(folder), a.eval_windows, a.seq_len, a.samples, a.seed)
    runs = {"fp32": {"perplexity": perplexity(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                                              held, bos)}}
    print(f"fp32: perplexity {runs['fp32']['perplexity']:.3f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in a.recipes.split(","):
            runs[recipe] = score(folder, recipe, calib, a.seq_len, held, bos, Path(tmp))
            r = runs[recipe]
            print(f"{recipe}: perplexity {r['perplexity']:.3f}, convert {r['convert_seconds']} s"
                  + (f", GPTQ loss / RTN loss {r['gptq_loss_vs_rtn_mean']:.3f}" if r["gptq_loss_vs_rtn_mean"] else ""),
                  flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
