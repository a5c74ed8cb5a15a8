"""Which families quantkit converts: one row per family, one column per recipe.

Every family is a tiny random model built from transformers' own config class
(``tests/families.py``, ``tests/arch_configs.py``; weights N(0, 0.05)). Each recipe converts it
(or is refused: its one line is quoted), the output is read back by plain transformers +
compressed-tensors with ``dtype="auto"`` (by ``quantkit.load`` where transformers reports
tensors missing: gpt-oss's and Granite 4's per-expert linears), and its logits on 32 random token
ids are compared with the float model's: the largest difference over the largest float logit, and
the top-1 agreement. The trace the architecture is derived from is timed against the W8A16 conversion.

Usage (main venv)::

    .venv/bin/python benchmarks/families.py --out out/families.json --markdown out/families.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

RECIPES = ("w8a16", "fp8-dynamic", "w4a16-g64-gptq", "nvfp4a16", "awq-w4a16-g64")


def _families() -> dict[str, object]:
    from arch_configs import tiny_config
    from families import FAMILIES, VISION_FAMILIES, family_config

    from quantkit.arch.table import ARCHITECTURES

    table = {f"{a} (table)": (lambda a=a: tiny_config(a)) for a in ARCHITECTURES}
    derived = {f: (lambda f=f: family_config(f)) for f in [*FAMILIES, *VISION_FAMILIES]}
    return {**derived, **table}


def _cell(folder: Path, recipe: str, ref, cls, ids: list[list[int]], work: Path) -> dict:
    import quantkit
    from quantkit.errors import QuantkitError

    out = work / recipe
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    try:
        quantkit.quantize(str(folder), recipe, calibration=ids).save(out)
    except QuantkitError as e:
        return {"refused": str(e)}
    seconds = time.perf_counter() - start
    try:
        got, info = cls.from_pretrained(out, dtype="auto", output_loading_info=True)
    except Exception as e:  # transformers' own error, quoted
        return {"seconds": seconds, "load_error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    reader = "transformers"
    if info["missing_keys"]:   # names plain transformers has no place for (gpt-oss's, Granite 4's per-expert linears)
        got, reader = quantkit.load(out), "quantkit.load"
    x = torch.tensor([ids[0][:32]])
    with torch.no_grad():
        a, b = ref(input_ids=x).logits.float(), got(input_ids=x).logits.float()
    return {"seconds": round(seconds, 2), "rel": round(float((a - b).abs().max() / a.abs().max()), 4),
            "top1": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 3), "dtype": str(got.dtype),
            "reader": reader}


def _row(name: str, make, work: Path) -> dict:
    from families import save_random
    from quantkit.arch.derive import derive_spec
    from quantkit.arch.families import family_fields
    from quantkit.arch.meta import auto_class, traceable_model
    from quantkit.errors import QuantkitError

    config = make()
    folder = work / "model"
    save_random(config, folder)
    start = time.perf_counter()
    try:
        derive_spec(traceable_model(config), config, family_fields(config).get("moe"))
        trace = round(time.perf_counter() - start, 3)
    except QuantkitError as e:
        trace = f"refused: {e}"
    cls = auto_class(config)
    ref = cls.from_pretrained(folder, dtype=torch.float32)
    vocab = getattr(config.get_text_config(), "vocab_size", 256)
    ids = [[int(t) for t in torch.randint(1, vocab, (64,), generator=torch.Generator().manual_seed(i))]
           for i in range(8)]
    return {"family": name, "class": type(ref).__name__, "trace_s": trace,
            "cells": {r: _cell(folder, r, ref, cls, ids, work) for r in RECIPES}}


def _markdown(rows: list[dict]) -> str:
    head = "| family | class | trace s | " + " | ".join(RECIPES) + " |"
    lines = [head, "|" + "---|" * (3 + len(RECIPES))]
    for r in rows:
        cells = []
        for recipe in RECIPES:
            c = r["cells"][recipe]
            if "refused" in c:
                cells.append(f"refused: {c['refused'].split(': ', 1)[-1][:90]}")
            elif "load_error" in c:
                cells.append(f"converted; transformers: {c['load_error'][:80]}")
            else:
                read = " (quantkit.load)" if c.get("reader") == "quantkit.load" else ""
                cells.append(f"{c['rel']:.3f} / {c['top1']:.2f}{read}")
        trace = r["trace_s"] if isinstance(r["trace_s"], float) else "refused"
        lines.append(f"| {r['family']} | {r['class']} | {trace} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def trace_cost() -> list[dict]:
    """Seconds to build the meta model and to trace and derive it, for full-size configs."""
    import transformers

    from quantkit.arch.derive import derive_spec
    from quantkit.arch.meta import traceable_model

    configs = {"Llama-3.1-70B": transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672,
                                                         num_hidden_layers=80, num_attention_heads=64,
                                                         num_key_value_heads=8, vocab_size=128256),
               "DeepSeek-V3 (671B)": transformers.DeepseekV3Config(),
               "Qwen3-Next-80B-A3B": transformers.Qwen3NextConfig()}
    rows = []
    for name, config in configs.items():
        start = time.perf_counter()
        model = traceable_model(config)
        built = time.perf_counter()
        derive_spec(model, config)
        rows.append({"config": name, "layers": config.num_hidden_layers, "build_s": round(built - start, 1),
                     "trace_s": round(time.perf_counter() - built, 1)})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--only", nargs="*", help="families to run (default: all)")
    parser.add_argument("--trace-cost", action="store_true", help="time the derivation on full-size configs only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.trace_cost:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(trace_cost(), indent=1))
        return
    rows = []
    for name, make in _families().items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                rows.append(_row(name, make, Path(tmp)))
            except Exception as e:  # a family transformers cannot build or save here
                rows.append({"family": name, "class": "-", "trace_s": f"refused: {e}",
                             "cells": {r: {"refused": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
                                       for r in RECIPES}})
        print(_markdown(rows[-1:]).splitlines()[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    if args.markdown:
        args.markdown.write_text(_markdown(rows))


if __name__ == "__main__":
    main()
