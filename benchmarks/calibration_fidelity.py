"""Benchmark: does the stratified calibration set win on every task of a skewed traffic log?

    python benchmarks/calibration_fidelity.py [--conditions traffic,sqrt,balanced,random,generic]
        [--seeds 0,1,2] [--samples 128] [--json OUT.jsonl]
    python benchmarks/calibration_fidelity.py --report OUT.jsonl [OUT2.jsonl ...]

The log (built once into ``.cache/benchmarks/calibration-fidelity/``, deterministic): the rows
of the embedded default log (``calibration/default.jsonl``, 8 tasks from the offline corpora),
split by content hash into a held-out evaluation log (``EVAL_ROWS`` distinct rows per task) and
a traffic log of ``TRAFFIC_ROWS`` requests drawn from the rest the way a service sees them: a
few tasks carry most of the traffic with heavily repeated requests (a FAQ-like chat task of 60
distinct texts is 28% of the requests), a rare long-document task (12 documents, 1%), and
``MALFORMED`` broken lines. No evaluation text occurs in the traffic log (checked).

``label_log`` builds a second log of another shape (in memory, for the benchmark and the tests):
a sentiment classifier's traffic, 60% of the rows, whose replies are one word (positive,
negative, neutral); the rest document QA, code, extraction, summarisation and math rows of the
embedded default log, and a few documents of several thousand tokens.

Conditions, each a GPTQ W4A16 g64 conversion of SmolLM2 (``w4a16-g64-gptq``: 128 samples of at
most 512 tokens) from ``--samples`` calibration texts:

- ``traffic``, ``sqrt``, ``balanced``: ``quantkit calibrate``'s allocation policies (allocate.py);
- ``random``: uniformly random lines of the log (repeats and all, as a user would cut a sample);
- ``generic``: windows of generic public text (the English Linux kernel documentation, the
  Debian ``linux-doc-6.1`` package, minus every file the log's rows come from).

Each is evaluated as ``quantkit eval --calib`` would (business.py: through the chat template,
scoring the assistant turns; bootstrap intervals over rows) on the held-out log's task slices,
generation left out. ``--report`` prints per task the mean KL over seeds, the seed spread and
the default policy's bootstrap half-width, and checks the acceptance criteria: the default beats
random rows on the mean by more than the seed spread and loses on no task by more than its
interval; generic text loses to it on every task.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "benchmarks" / "calibration-fidelity"
DATA_SEED = 20261201
TRAFFIC_ROWS = 20000
EVAL_ROWS = 32
MALFORMED = 100
RECIPE = "w4a16-g64-gptq"
DEFAULT = "traffic"
# task: (share of the requests, distinct texts it draws from (None: all left), Zipf exponent of
# its repeats (0: uniform)). Chat is an FAQ bot: few texts, sent again and again.
TRAFFIC = {
    "chat": (0.28, 60, 1.1),
    "classification": (0.18, 120, 1.0),
    "math": (0.12, 80, 0.8),
    "code": (0.12, None, 0.0),
    "extraction": (0.10, None, 0.0),
    "translation": (0.10, None, 0.0),
    "summarisation": (0.09, None, 0.0),
    "qa_document": (0.01, 12, 0.0),
}
CONDITIONS = ("traffic", "sqrt", "balanced", "random", "generic")

# The second log (label_log): task -> share of the rows; "long_document" is LONG_DOCUMENTS rows.
LABEL_TRAFFIC = {"classification": 0.60, "qa_document": 0.09, "code": 0.08, "extraction": 0.08,
                 "summarisation": 0.08, "math": 0.07}
LONG_DOCUMENTS = 3
SENTIMENT = {
    "positive": ("works perfectly", "arrived early and well packed", "is the best thing I bought this year",
                 "exceeded what I hoped for", "was set up in minutes and has run flawlessly since",
                 "made the whole family happy", "is worth every cent", "feels solid and well made"),
    "negative": ("broke after two days", "arrived late and damaged", "was a complete waste of money",
                 "stopped working within a week", "smells of burnt plastic", "never matched the photos",
                 "left us waiting an hour for nothing", "is flimsy and cheap"),
    "neutral": ("arrived on the date given", "does what the description says", "is about the size I expected",
                "came in a plain box", "is one of several we use", "was delivered to the front desk",
                "has the usual two buttons", "is sold in three colours"),
}
SUBJECTS = ("The kettle", "This phone case", "The hotel room", "The delivery", "Our order", "The headphones",
            "The software update", "The desk lamp", "The rental car", "The blender", "This backpack",
            "The coffee machine", "The new router", "The running shoes", "The hair dryer", "The tent")
ASIDES = ("", "I bought it for my sister.", "We used it for a week.", "The price was as listed.",
          "It came with a manual in four languages.", "My neighbour has the same one.",
          "I ordered it on a Monday.", "We paid by card.")
INSTRUCTION = ("Classify the sentiment of this customer review as positive, negative or neutral. "
               "Reply with the label only.\n\nReview: ")


def sentiment_row(rng: random.Random) -> dict:
    """One classification request and its one-word reply."""
    label = rng.choice(sorted(SENTIMENT))
    review = " ".join(x for x in (f"{rng.choice(SUBJECTS)} {rng.choice(SENTIMENT[label])}.", rng.choice(ASIDES),
                                  f"Order {rng.randrange(10**5):05d}.") if x)
    return {"task": "classification", "messages": [{"role": "user", "content": INSTRUCTION + review},
                                                   {"role": "assistant", "content": label}]}


def label_log(rows: int = TRAFFIC_ROWS, seed: int = DATA_SEED) -> list[dict]:
    """The second log: ``rows`` records, classification-dominated (LABEL_TRAFFIC), in traffic order."""
    rng = random.Random(seed)
    by_task: dict[str, list[dict]] = defaultdict(list)
    for line in (ROOT / "calibration" / "default.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        by_task[rec["task"]].append({"task": rec["task"], "messages": rec["messages"]})
    out = [sentiment_row(rng) for _ in range(round(LABEL_TRAFFIC["classification"] * rows))]
    for task, share in LABEL_TRAFFIC.items():
        if task != "classification":
            out += rng.choices(by_task[task], k=round(share * rows))
    docs = [m["content"] for r in by_task["qa_document"] for m in r["messages"] if m["role"] == "user"]
    for k in range(LONG_DOCUMENTS):   # several documents joined: a few thousand tokens each
        text = "\n\n".join(rng.sample(docs, 6))
        out.append({"task": "long_document", "messages": [
            {"role": "user", "content": f"{text}\n\nWhich of these documents is the longest, and what is it about?"}]})
    rng.shuffle(out)
    return out


def _content(record: dict) -> str:
    from quantkit.calibration.config import FieldMap
    from quantkit.calibration.render import render_record
    return render_record(0, record, FieldMap(), lambda messages: "").content


def build_logs(folder: Path = CACHE) -> dict[str, Path]:
    """The traffic log, the held-out evaluation log and the generic text (built once)."""
    from quantkit.calibration.dedup import content_key

    paths = {"traffic": folder / "traffic.jsonl", "eval": folder / "eval.jsonl", "generic": folder / "generic.json"}
    if all(p.exists() for p in paths.values()):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(DATA_SEED)
    by_task: dict[str, list[dict]] = defaultdict(list)
    for line in (ROOT / "calibration" / "default.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        by_task[rec["task"]].append(rec)
    held, held_keys, pools = [], set(), {}
    for task in sorted(by_task):
        rows = by_task[task][:]
        rng.shuffle(rows)
        held += rows[:EVAL_ROWS]
        held_keys |= {content_key(_content(r)) for r in rows[:EVAL_ROWS]}
        pools[task] = rows[EVAL_ROWS:]
    traffic = []
    for task, (share, distinct, zipf) in TRAFFIC.items():
        pool = [r for r in pools[task] if content_key(_content(r)) not in held_keys]
        pool = pool[:distinct] if distinct else pool
        weights = [1.0 / (k + 1) ** zipf for k in range(len(pool))]
        traffic += rng.choices(pool, weights=weights, k=round(share * TRAFFIC_ROWS))
    lines = [json.dumps({"task": r["task"], "messages": r["messages"]}, ensure_ascii=False) for r in traffic]
    broken = ['{"task": "chat", "messages": [{"role": "user", "content": "cut off', '{"task": "chat"}',
              "[]", '{"messages": "not a list"}']
    lines += [broken[i % len(broken)] for i in range(MALFORMED)]
    rng.shuffle(lines)
    leaked = {content_key(_content(r)) for r in traffic} & held_keys
    assert not leaked, f"{len(leaked)} evaluation texts in the traffic log"
    rng.shuffle(held)
    paths["traffic"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths["eval"].write_text("\n".join(json.dumps({"task": r["task"], "messages": r["messages"]}, ensure_ascii=False)
                                       for r in held) + "\n", encoding="utf-8")
    paths["generic"].write_text(json.dumps(generic_documents(folder, by_task), ensure_ascii=False), encoding="utf-8")
    return paths


def generic_documents(folder: Path, by_task: dict[str, list[dict]]) -> list[str]:
    """English kernel documentation files, none of which any row of the default log comes from."""
    deb_dir = folder / "linux-doc"
    deb_dir.mkdir(exist_ok=True)
    debs = sorted(deb_dir.glob("linux-doc-6.1_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", "linux-doc-6.1"], cwd=deb_dir, check=True, capture_output=True)
        debs = sorted(deb_dir.glob("linux-doc-6.1_*.deb"))
    tree = deb_dir / "tree"
    if not tree.exists():
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(tree)], check=True)
    used = {r["source"].split(":", 1)[1].split("#")[0].rsplit("Documentation/", 1)[-1]
            for rows in by_task.values() for r in rows if r["source"].startswith("linux-doc")}
    docs = []
    base = tree / "usr/share/doc/linux-doc-6.1/Documentation"
    for f in sorted(base.rglob("*.rst.gz")):
        rel = str(f.relative_to(base))
        if rel.startswith("translations/") or rel in used:
            continue
        text = gzip.decompress(f.read_bytes()).decode("utf-8", "replace")
        if len(text) > 2000:
            docs.append(text)
    return docs


def calibration_ids(condition: str, seed: int, paths: dict[str, Path], tok, n: int, max_len: int):
    """Token ids for one condition, and what they hold (task -> samples)."""
    from quantkit.calibration.config import FieldMap
    from quantkit.calibration.encoding import encode_ids, special_affixes, truncate, with_affixes
    from quantkit.calibration.render import RowError, chat_renderer, render_record

    affixes = special_affixes(tok)
    if condition in ("traffic", "sqrt", "balanced"):
        from quantkit.calibration.api import calibrate
        res = calibrate(paths["traffic"], tok, num_samples=n, max_len=max_len, seed=seed, policy=condition)
        return res.input_ids, dict(Counter(s["task"] for s in res.samples))
    rng = random.Random(seed)
    if condition == "random":
        render, rows = chat_renderer(tok), []
        for i, line in enumerate(paths["traffic"].read_text(encoding="utf-8").splitlines()):
            try:
                rows.append(render_record(i + 1, json.loads(line), FieldMap(), render))
            except (ValueError, RowError, AttributeError, TypeError):
                continue          # a malformed line: the user's cut would drop it too
        picked = rng.sample(rows, n)
        ids = [truncate(with_affixes(x, affixes), max_len, affixes) for x in encode_ids(tok, [r.text for r in picked])]
        return ids, dict(Counter(r.task for r in picked))
    if condition == "generic":   # the usual generic set: documents joined and cut into max_len windows
        docs = json.loads(paths["generic"].read_text(encoding="utf-8"))
        rng.shuffle(docs)
        chosen, chars = [], 0
        while docs and chars < 16 * n * max_len:   # ~4 characters a token: 4x the tokens needed
            chosen.append(docs.pop())
            chars += len(chosen[-1])
        stream = [t for ids in encode_ids(tok, chosen) for t in ids]
        starts = sorted(rng.sample(range(0, len(stream) // max_len), n))
        body = max_len - len(affixes.prefix)
        return [with_affixes(stream[s * max_len:s * max_len + body], affixes) for s in starts], {"generic": n}
    raise SystemExit(f"--conditions: unknown condition {condition!r} (expected {', '.join(CONDITIONS)})")


def run(args) -> None:
    import torch

    import quantkit
    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.business import read_business
    from quantkit.evaluation.checkpoint import load_model, load_tokenizer
    from quantkit.inputs.models import default_model_dir
    from quantkit.recipe import load_recipe

    paths = build_logs()
    folder = default_model_dir()
    tok = load_tokenizer(folder)
    recipe = load_recipe(RECIPE)
    max_len = recipe.calibration.max_seq_len
    base = load_model(folder)
    business = read_business(paths["eval"], tok, args.rows)
    opts = SuiteOptions(gen_prompts=0, business_rows=args.rows, business_tokens=args.row_tokens,
                        business_scored_tokens=args.scored_tokens)
    machine = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
               "torch": torch.__version__, "affinity": sorted(os.sched_getaffinity(0))}
    say = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    for seed in (int(s) for s in args.seeds.split(",")):
        for condition in args.conditions.split(","):
            ids, mix = calibration_ids(condition, seed, paths, tok, args.samples, max_len)
            row = {"condition": condition, "seed": seed, "samples": len(ids), "sample_tasks": mix,
                   "sample_tokens": sum(map(len, ids)), "recipe": RECIPE, "machine": machine,
                   "business": {"rows": args.rows, "row_tokens": args.row_tokens, "scored_tokens": args.scored_tokens}}
            with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as tmp:
                c0 = time.process_time()
                q = quantkit.quantize(folder, recipe, ids, quantkit.ConvertOptions(out=Path(tmp) / "ckpt", log=say))
                path = q.save()
                row["convert_cpu_s"] = round(time.process_time() - c0, 1)
                cand = load_model(path)
                c0 = time.process_time()
                result = evaluate(base, cand, tok, suite=business.slices, max_len=2048, options=opts, progress=False)
                row["eval_cpu_s"] = round(time.process_time() - c0, 1)
            row["slices"] = {name: {k: v[k] for k in ("kl_mean", "kl_mean_ci", "top1_agreement", "ppl_increase", "tokens")
                                    if k in v} for name, v in result.slices.items()}
            kls = [v["kl_mean"] for v in row["slices"].values()]
            row["kl_mean"] = sum(kls) / len(kls)
            say(f"{condition} seed {seed}: mean KL {row['kl_mean']:.4f} over {len(kls)} task slices")
            if args.json:
                with args.json.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")


def report(files: list[Path]) -> None:
    rows = [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    by = defaultdict(dict)
    for r in rows:
        by[r["condition"]][r["seed"]] = r
    conds = [c for c in CONDITIONS if c in by]
    tasks = sorted(next(iter(by[conds[0]].values()))["slices"])
    mean = lambda xs: sum(xs) / len(xs)   # noqa: E731

    def task_kl(c, t):
        return [r["slices"][t]["kl_mean"] for r in by[c].values()]

    print("| task slice | " + " | ".join(f"{c} ({len(by[c])} seeds)" for c in conds) + " |")
    print("| --- | " + " | ".join("---" for _ in conds) + " |")
    for t in tasks:
        cells = []
        for c in conds:
            v = task_kl(c, t)
            cells.append(f"{mean(v):.4f} ± {(max(v) - min(v)) / 2:.4f}")
        print(f"| {t} | " + " | ".join(cells) + " |")
    means = {c: [r["kl_mean"] for r in by[c].values()] for c in conds}
    print("| **mean** | " + " | ".join(f"**{mean(means[c]):.4f}** ({', '.join(f'{x:.4f}' for x in means[c])})"
                                       for c in conds) + " |")
    if DEFAULT not in by:
        return
    checks = []
    for other in ("random", "sqrt", "balanced"):
        if other not in by:
            continue
        spread = max(max(means[c]) - min(means[c]) for c in (DEFAULT, other))
        gain = mean(means[other]) - mean(means[DEFAULT])
        checks.append(f"{DEFAULT} vs {other}: mean KL lower by {gain:.4f} (seed spread {spread:.4f}): "
                      f"{'beats' if gain > spread else 'NOT beyond the spread'}")
        losses = []
        for t in tasks:
            d = mean(task_kl(DEFAULT, t)) - mean(task_kl(other, t))
            cis = [r["slices"][t]["kl_mean_ci"] for r in by[DEFAULT].values()]
            half = mean([(hi - lo) / 2 for lo, hi in cis])
            if d > 0:
                losses.append(f"{t} +{d:.4f} ({'within' if d <= half else 'BEYOND'} its interval ±{half:.4f})")
        checks.append(f"  task slices where {DEFAULT} loses to {other}: {', '.join(losses) or 'none'}")
    if "generic" in by:
        worse = [t for t in tasks if mean(task_kl("generic", t)) > mean(task_kl(DEFAULT, t))]
        checks.append(f"generic text loses to {DEFAULT} on {len(worse)} of {len(tasks)} task slices"
                      + ("" if len(worse) == len(tasks) else f" (not on {', '.join(sorted(set(tasks) - set(worse)))})"))
    print()
    print("\n".join(checks))
    print()
    for c in conds:
        r = next(iter(by[c].values()))
        mix = Counter()
        for rr in by[c].values():
            mix.update(rr["sample_tasks"])
        print(f"{c}: samples per task over {len(by[c])} seeds {dict(mix)}; convert {statistics.median(x['convert_cpu_s'] for x in by[c].values()):.0f} CPU s, "
              f"eval {statistics.median(x['eval_cpu_s'] for x in by[c].values()):.0f} CPU s (median); {r['machine']['platform']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--rows", type=int, default=32, help="business rows per task (SuiteOptions.business_rows)")
    ap.add_argument("--row-tokens", type=int, default=1024, help="tokens per row (business_tokens)")
    ap.add_argument("--scored-tokens", type=int, default=4096, help="scored tokens per task (business_scored_tokens)")
    ap.add_argument("--json", type=Path, default=None, help="append one JSON line per conversion")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--report", type=Path, nargs="+", default=None)
    args = ap.parse_args()
    if args.report:
        report(args.report)
    elif args.build_only:
        paths = build_logs()
        for k, p in paths.items():
            print(k, p, p.stat().st_size)
    else:
        run(args)


if __name__ == "__main__":
    main()
