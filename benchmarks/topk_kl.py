"""Benchmark: the KL a server's top-k lists give (``evaluation/topk.py``) against the exact KL.

The embedded SmolLM2-135M-Instruct (float32, transformers) is the baseline; the candidates are
quantkit's own RTN checkpoints of it (``recipes/``: ``fp8-dynamic``, ``w8a8``, ``w4a16-g64``),
run back with ``quantkit.load``. Every text item of the default suite is scored teacher-forced,
one item per forward (short slices cut to ``--item-tokens``, the long ones to ``--long-tokens``),
and at each position the exact ``token_stats`` are kept with both models' top-``max(--k)`` lists
and the target's log-probability: what a server with ``logprobs: k`` returns. The lists for a
smaller k are the first k entries of the same lists.

Per candidate and k: the exact and estimated mean KL, the relative error of the mean, the mean
absolute per-token error, the share of slices whose mean KL is estimated within 5% / 10% with
the worst slice; the coarsened KL alone (``tail=False``, a lower bound), its error and the
share of tokens where it exceeds the exact KL by more than 1e-4; NLL and top-1 checked equal
to the exact ones.

    OMP_NUM_THREADS=2 python benchmarks/topk_kl.py --json benchmarks/topk_kl_measured.json

The scoring pass (20,122 positions, four models: about 5 minutes on 2 idle cores) is kept under
``.cache/benchmarks/topk`` and reused; ``--rescore`` runs it again.

Measured (``topk_kl_measured.json``, every text item, RTN candidates): at k = 20 the mean KL is
estimated 8.5% low for FP8_DYNAMIC, 6.6% for W8A8 and 15% for W4A16 g64; every slice of the two
8-bit candidates within 15% (W8A8 on numbers-en the worst), against 19% at k = 10 and 24% at
k = 5. NLLs and top-1 agreement are read back bit-identical at every k.

With ``--items 4 --k 50`` (5,800 positions): k = 50 against k = 20 cuts the mean error from 14.8%
to 12.9% (FP8_DYNAMIC), 8.7% to 6.5% (W8A8), 16.2% to 10.3% (W4A16 g64). There the worst slice is
FP8_DYNAMIC's numbers-zh, 32% low at k = 20 and 29% at k = 50: three positions where the
candidate's top-20 shares 0-2 tokens with the baseline's, exact KL 5-9 nats, estimated under 1
(``topk.py``: what no list shows).

The default k is 20: the most a vLLM server returns without ``--max-logprobs``, and the smallest
error measured on every item (a server started with ``--max-logprobs 50`` gives the better k = 50). It does not meet ``chosen_k``'s criterion (every slice of a candidate under the
NO-GO limit within 10%, no ``kl_mean`` level changed), and no k up to 20 does: the estimate errs
low, so a slice just over a limit reads under it (FP8_DYNAMIC on code-zh: 0.0612 against
``kl_mean``'s REVIEW limit 0.06 reads 0.057 at k = 20). A server verdict near a KL limit is the
optimistic one; 15% is the margin to allow.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
KEEP = HERE.parent.parent / ".cache" / "benchmarks" / "topk"
CANDIDATES = {"FP8_DYNAMIC": "fp8-dynamic", "W8A8": "w8a8", "W4A16 g64": "w4a16-g64"}   # RTN recipes


def candidate(src: Path, recipe: str):
    import quantkit

    target = KEEP / f"{src.name}-{recipe}"
    if not (target / "config.json").exists():
        quantkit.quantize(str(src), recipe).save(target, overwrite=True)
    return quantkit.load(target).eval()


def texts(tok, item_tokens: int, long_tokens: int, items: int | None) -> list[tuple[str, list[int]]]:
    """(slice name, token ids) of the first ``items`` text items (None: all) of each default slice."""
    from quantkit.evaluation.forced import encode_text
    from quantkit.evaluation.slices import load_suite

    out = []
    for s in load_suite("default"):
        for item in s.of_kind("text")[:items]:
            ids = encode_text(tok, item, long_tokens if s.long_context else item_tokens).ids
            if len(ids) > 1:
                out.append((s.name, ids))
    return out


def lists(lp, k: int) -> dict:
    """The top-k ids and log-probabilities of each row of ``lp`` ``[T, V]`` (log-softmaxed)."""
    vals, ids = lp.topk(k, dim=-1)
    return {"ids": ids, "lp": vals}


def score(models: dict, items: list, k: int) -> dict:
    """Per position, for the baseline and each candidate: target log-probability and top-k lists;
    per candidate the exact ``token_stats``."""
    import torch

    from quantkit.evaluation.divergence import token_stats

    rec = {"slice": [], "targets": [], "base": [], **{n: [] for n in models if n != "base"}}
    with torch.inference_mode():
        for i, (name, ids) in enumerate(items):
            x = torch.tensor([ids])
            targets = x[0, 1:]
            logits = {n: m(x).logits[0, :-1].float() for n, m in models.items()}
            rec["slice"] += [name] * len(targets)
            rec["targets"].append(targets)
            for n, lg in logits.items():
                lp = torch.log_softmax(lg, dim=-1)
                row = {**lists(lp, k), "target": lp.gather(-1, targets[:, None])[:, 0]}
                if n != "base":
                    row["exact"] = token_stats(logits["base"], lg, targets)
                rec[n].append(row)
            print(f"  item {i + 1}/{len(items)} {name}: {len(targets)} positions", flush=True)
    return _joined(rec)


def _joined(rec: dict) -> dict:
    import torch

    def cat(rows):
        if isinstance(rows[0], dict):
            return {key: cat([r[key] for r in rows]) for key in rows[0]}
        return torch.cat(rows)

    return {n: (v if n == "slice" else cat(v)) for n, v in rec.items()}


def topk_rows(side: dict, k: int) -> list:
    from quantkit.evaluation.topk import TopK

    ids, lp = side["ids"][:, :k].tolist(), side["lp"][:, :k].tolist()
    return [TopK(t, dict(zip(i, v))) for t, i, v in zip(side["target"].tolist(), ids, lp)]


def compare(rec: dict, name: str, k: int) -> dict:
    """The estimate at ``k`` against the exact stats, overall and per slice."""
    import torch

    from quantkit.evaluation.measures import MEASURES
    from quantkit.evaluation.topk import topk_token_stats

    exact = rec[name]["exact"]
    base, cand, targets = topk_rows(rec["base"], k), topk_rows(rec[name], k), rec["targets"].tolist()
    t0 = time.perf_counter()
    est = topk_token_stats(base, cand, targets)
    seconds = time.perf_counter() - t0
    low = topk_token_stats(base, cand, targets, tail=False)["kl"].double()
    ex, es = exact["kl"].double(), est["kl"].double()
    slices = {}
    for s in dict.fromkeys(rec["slice"]):
        m = torch.tensor([x == s for x in rec["slice"]])
        slices[s] = {"exact": float(ex[m].mean()), "estimate": float(es[m].mean())}
    rel = {s: v["estimate"] / v["exact"] - 1 for s, v in slices.items()}
    worst = max(rel, key=lambda s: abs(rel[s]))
    limit = MEASURES["kl_mean"].limit
    flips = [f"{s}: {limit.level(v['exact'])} read as {limit.level(v['estimate'])}"
             for s, v in slices.items() if limit.level(v["exact"]) != limit.level(v["estimate"])]
    return {
        "k": k, "tokens": len(ex), "exact_kl_mean": float(ex.mean()), "estimated_kl_mean": float(es.mean()),
        "rel_error_of_mean": float(es.mean() / ex.mean() - 1), "mean_abs_token_error": float((es - ex).abs().mean()),
        "lower_bound_kl_mean": float(low.mean()), "lower_bound_rel_error": float(low.mean() / ex.mean() - 1),
        "lower_bound_share_over_exact": float(((low - ex) > 1e-4).float().mean()),
        "lower_bound_max_over_exact": float((low - ex).max()),
        "share_slices_within_5pct": sum(abs(r) <= 0.05 for r in rel.values()) / len(rel),
        "share_slices_within_10pct": sum(abs(r) <= 0.10 for r in rel.values()) / len(rel),
        "worst_slice": worst, "worst_slice_rel_error": rel[worst], "kl_mean_level_flips": flips,
        "nll_equal": bool(torch.equal(est["nll_base"], exact["nll_base"]) and torch.equal(est["nll_cand"], exact["nll_cand"])),
        "top1_equal": bool(torch.equal(est["top1"], exact["top1"])), "estimate_s": seconds,
        "slices": {s: {**v, "rel_error": rel[s]} for s, v in slices.items()},
    }


def scored(args, src: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from quantkit.evaluation.checkpoint import load_tokenizer

    cache = KEEP / f"scores-{args.item_tokens}-{args.long_tokens}-{max(args.k)}-{args.items or 'all'}.pt"
    if cache.exists() and not args.rescore:
        return torch.load(cache)
    t0 = time.perf_counter()
    models = {"base": AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()}
    models.update({n: candidate(src, r) for n, r in CANDIDATES.items()})
    load_s = time.perf_counter() - t0
    items = texts(load_tokenizer(src), args.item_tokens, args.long_tokens, args.items)
    t0 = time.perf_counter()
    rec = score(models, items, max(args.k))
    rec["meta"] = {"items": len(items), "load_s": load_s, "score_s": time.perf_counter() - t0}
    KEEP.mkdir(parents=True, exist_ok=True)
    torch.save(rec, cache)
    return rec


def chosen_k(rows: dict, tolerance: float) -> dict:
    """The smallest k at which no slice's ``kl_mean`` level (GO / REVIEW / NO-GO) changes and every
    slice of a candidate under the NO-GO limit (where a reading decides the verdict) is estimated
    within ``tolerance``; else the largest k measured."""
    from quantkit.evaluation.measures import MEASURES

    nogo = MEASURES["kl_mean"].limit.nogo
    ks = [r["k"] for r in next(iter(rows.values()))]
    for i, k in enumerate(ks):
        near = [by_k[i] for by_k in rows.values() if by_k[i]["exact_kl_mean"] < nogo]
        if (not any(by_k[i]["kl_mean_level_flips"] for by_k in rows.values())
                and all(abs(r["worst_slice_rel_error"]) <= tolerance for r in near)):
            return {"k": k, "met": True, "tolerance": tolerance}
    return {"k": ks[-1], "met": False, "tolerance": tolerance}


def print_table(rows: dict) -> None:
    print(f"\n{'candidate':12s} {'k':>3s} {'exact KL':>9s} {'estimate':>9s} {'rel err':>8s} {'|tok err|':>9s} "
          f"{'<=5%':>5s} {'<=10%':>6s} {'bound':>8s}  worst slice")
    for name, by_k in rows.items():
        for r in by_k:
            print(f"{name:12s} {r['k']:3d} {r['exact_kl_mean']:9.5f} {r['estimated_kl_mean']:9.5f} "
                  f"{r['rel_error_of_mean']:+8.2%} {r['mean_abs_token_error']:9.5f} {r['share_slices_within_5pct']:5.2f} "
                  f"{r['share_slices_within_10pct']:6.2f} {r['lower_bound_rel_error']:+8.2%}  {r['worst_slice']} {r['worst_slice_rel_error']:+.2%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, action="append", help="list length (repeatable; default 5, 10, 20)")
    ap.add_argument("--items", type=int, default=None, help="text items per slice (default: all)")
    ap.add_argument("--item-tokens", type=int, default=192, help="short slices' texts cut to this many tokens")
    ap.add_argument("--long-tokens", type=int, default=1024, help="long slices' texts cut to this many tokens")
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="largest slice-mean relative error accepted for the chosen k (see chosen_k)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rescore", action="store_true", help="run the scoring pass again, not the kept one")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.k = sorted(args.k or [5, 10, 20])

    import torch

    from quantkit.evaluation.measures import MEASURES
    from quantkit.inputs.embedded_model import default_model_dir

    torch.set_num_threads(args.threads)
    rec = scored(args, default_model_dir())
    rows = {n: [compare(rec, n, k) for k in args.k] for n in CANDIDATES}
    print_table(rows)
    choice = chosen_k(rows, args.tolerance)
    print(f"\nchosen k: {choice['k']} ({'meets' if choice['met'] else 'the largest measured: none meets'} "
          f"the criterion at tolerance {args.tolerance:.0%})")
    for name, by_k in rows.items():
        for r in by_k:
            for f in r["kl_mean_level_flips"]:
                print(f"  {name} k={r['k']}: {f}")
    if args.json:
        out = {"model": "SmolLM2-135M-Instruct (float32)", "candidates": CANDIDATES, "algorithm": "rtn",
               "items_per_slice": args.items or "all", "item_tokens": args.item_tokens, "long_tokens": args.long_tokens, **rec["meta"],
               "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                           "platform": platform.platform(), "torch": torch.__version__, "python": sys.version.split()[0]},
               "kl_mean_limit": {"review": MEASURES["kl_mean"].limit.review, "nogo": MEASURES["kl_mean"].limit.nogo},
               "chosen_k": choice, "results": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
