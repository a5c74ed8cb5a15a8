"""Benchmark: KL by position for each KV-cache option, K and V apart.

For a model and each context length: the ``--slice`` text (``long-en``) cut at LENGTH tokens and
scored in one window, through the evaluation's own teacher-forced pass (``run_forced``, each
variant's head over 1024-position chunks), against the float model:

  - each KV option on the **float** weights (the KV error alone): ``fp8-tensor``, ``fp8-head``,
    ``fp8-token-head``, ``int8-token-head``, ``int8-kivi``, each also K-only (``:k``) and V-only
    (``:v``). Static options' scales are taken as ``quantkit eval --kv`` takes them for a model
    without checkpoint scales (``evaluation/kv_options.py``: absmax over the default calibration
    log's 16 rows of up to 4096 tokens), once per format, shared by its ``:k`` / ``:v`` variants;
  - weight-only checkpoints (``--weights``, presets or recipes; RTN), loaded with ``quantkit.load``:
    the error the KV options sit on top of, and the evidence for ``kl_last_bucket``'s limits.

Per variant: KL(baseline || variant) mean, in the first bucket (positions 0-127) and the last
(LENGTH/2 to LENGTH), the worst bucket, and the KV bytes a token takes (``KVOption.bytes_per_token``:
codes, per-token scales, the unquantized part at 2 bytes).

    OMP_NUM_THREADS=1 nice -n 5 taskset -c 0 .venv/bin/python benchmarks/kv_position.py \\
        --model smollm2 --length 2048 --length 8192 --json kv_smollm2.json
    .venv/bin/python benchmarks/kv_position.py --table kv_smollm2.json     # the RESULTS table

A run takes one body forward per variant and length (SmolLM2 at 8192 tokens: about 115 CPU s),
so ``--parts full`` / ``k`` / ``v`` split the work into runs (static scales are kept beside the
weight checkpoints under ``.cache/benchmarks/kvpos`` and reused).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from gptq import model_dir  # noqa: E402

FORMATS = ("fp8-tensor", "fp8-head", "fp8-token-head", "int8-token-head", "int8-kivi")
KEEP = HERE.parent.parent / ".cache" / "benchmarks" / "kvpos"


PARTS = {"full": "", "k": ":k", "v": ":v"}


def options(formats: list[str], parts: list[str]) -> list[str]:
    return [f"{f}{PARTS[p]}" for p in parts for f in formats]


def prepared_options(model, names: list[str], tok, max_len: int, cache: Path) -> dict:
    """name -> PreparedKV; static formats calibrated once (as ``quantkit eval --kv`` calibrates),
    their K-only and V-only options sharing those scales, kept in ``cache`` for the next run."""
    import torch

    from quantkit.evaluation.kv_options import candidate_kv
    from quantkit.kv_cache import PreparedKV, kv_option

    full: dict[str, PreparedKV] = {}
    out = {}
    for name in names:
        opt = kv_option(name)
        fmt = opt.format.name
        if fmt not in full:
            saved = cache.with_name(f"{cache.name}-{fmt}-{max_len}.pt")
            if saved.exists():
                source, scales = torch.load(saved)
                full[fmt] = PreparedKV(kv_option(fmt), source, scales)
            else:
                full[fmt] = candidate_kv(model, [kv_option(fmt)], tok, None, max_len).prepared[0]
                saved.parent.mkdir(parents=True, exist_ok=True)
                torch.save((full[fmt].source, full[fmt].scales), saved)
        base = full[fmt]
        out[name] = PreparedKV(opt, base.source, base.scales)
    return out


def weight_candidate(model_name: str, src: Path, recipe: str):
    import quantkit

    target = KEEP / f"{model_name}-{Path(recipe).stem}"
    if not (target / "config.json").exists():
        quantkit.quantize(str(src), recipe).save(target)
    return quantkit.load(target).eval()


def table(paths: list[Path]) -> str:
    """The RESULTS table of saved runs (of one model): one row per variant, first and last bucket
    and mean per length."""
    d = json.loads(paths[0].read_text())
    for p in paths[1:]:
        more = json.loads(p.read_text())
        d["bytes_per_token"].update(more["bytes_per_token"])
        for n, run in more["runs"].items():
            d["runs"].setdefault(n, {"variants": {}})["variants"].update(run["variants"])
    lengths = sorted(d["runs"], key=int)
    names = list(dict.fromkeys(v for n in lengths for v in d["runs"][n]["variants"]))
    head = "| variant | KV bytes / token | " + " | ".join(
        f"{n}: first / last bucket / mean" for n in lengths) + " |"
    lines = [head, "|---|---|" + "---|" * len(lengths)]
    for name in names:
        b = d["bytes_per_token"].get(name.removeprefix("kv "), d["bytes_per_token"]["fp16"])
        cells = []
        for n in lengths:
            v = d["runs"][n]["variants"].get(name)
            cells.append("–" if v is None else
                         f"{v['kl_first_bucket']:.3g} / {v['kl_last_bucket']:.3g} / {v['kl_mean']:.3g}")
        lines.append(f"| {name} | {b:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", type=Path, action="append", help="print the RESULTS table of saved --json runs and stop")
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a model folder")
    ap.add_argument("--length", type=int, action="append", help="context length (repeatable)")
    ap.add_argument("--slice", default="long-en")
    ap.add_argument("--formats", default=",".join(FORMATS), help="KV formats")
    ap.add_argument("--parts", default="full,k,v", help="which of each format: full, k (K only), v (V only)")
    ap.add_argument("--options", default=None, help="explicit KV options (comma list), in place of --formats x --parts")
    ap.add_argument("--weights", default="fp8_dynamic", help="weight-only candidates (comma list; '' for none)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    if not args.length:
        ap.error("--length is required")

    import contextlib
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from quantkit.evaluation.checkpoint import load_tokenizer
    from quantkit.evaluation.forced import ForcedRequest, encode_text, run_forced
    from quantkit.evaluation.measures import forced_summary
    from quantkit.evaluation.slices import load_suite
    from quantkit.kv_cache import apply_kv_option, kv_option

    src = model_dir(args.model)
    tok = load_tokenizer(src)
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    kv_model = copy.deepcopy(base)     # the float weights the KV options run on
    cfg = base.config.get_text_config()
    dims = (cfg.num_hidden_layers, cfg.num_key_value_heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    names = (args.options.split(",") if args.options else
             options([f for f in args.formats.split(",") if f], args.parts.split(",")))
    t = time.perf_counter()
    prepared = prepared_options(kv_model, names, tok, max(args.length), KEEP / f"{Path(src).name}-scales")
    prepare_s = time.perf_counter() - t
    weights = {w: weight_candidate(args.model, src, w) for w in args.weights.split(",") if w}
    text = load_suite(args.slice)[0].of_kind("text")[0]
    out = {"model": str(src), "slice": args.slice, "text_tokens": len(tok(text["text"])["input_ids"]),
           "kv_dims": dims, "prepare_s": prepare_s, "attention": base.config._attn_implementation,
           "scales": {n: p.source for n, p in prepared.items()},
           "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                       "platform": platform.platform(), "torch": torch.__version__},
           "bytes_per_token": {"fp16": 2 * dims[0] * dims[1] * dims[2] * 2,
                               **{n: kv_option(n).bytes_per_token(*dims) for n in names}},
           "runs": {}}
    views = {f"weights {w}": (lambda m, w=w: contextlib.nullcontext(weights[w])) for w in weights}
    views.update({f"kv {n}": (lambda m, p=p: apply_kv_option(kv_model, p)) for n, p in prepared.items()})
    first, *rest = views
    for length in args.length:
        enc = [encode_text(tok, text, length)]
        t, c = time.perf_counter(), time.process_time()
        with views[first](None) as cand:   # the first variant is run_forced's candidate, the rest views
            r = run_forced(base, cand, enc, ForcedRequest(length, length, bucket_positions=True), 0,
                           views={n: views[n] for n in rest})
        s = forced_summary(r)
        rows = {first: {"kl_mean": s["kl_mean"], "top1_agreement": s["top1_agreement"], "buckets": r.buckets,
                        **{k: s[k] for k in ("kl_first_bucket", "kl_last_bucket", "kl_worst_bucket")}}}
        rows.update(r.views)
        out["runs"][str(length)] = {"tokens": len(enc[0].ids), "wall_s": time.perf_counter() - t,
                                    "cpu_s": time.process_time() - c, "variants": rows,
                                    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
        print(f"\n{args.model} at {length} tokens ({time.perf_counter() - t:.0f} s)")
        print(f"{'variant':28s} {'B/token':>8s} {'mean':>9s} {'first':>9s} {'last':>9s} {'worst':>9s}")
        for n, v in rows.items():
            b = out["bytes_per_token"].get(n.removeprefix("kv "), "")
            print(f"{n:28s} {b!s:>8s} {v['kl_mean']:9.5f} {v['kl_first_bucket']:9.5f} {v['kl_last_bucket']:9.5f} "
                  f"{v['kl_worst_bucket']:9.5f}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
