"""Benchmark: does the stratified calibration set beat random rows on every task of a traffic log?

    python benchmarks/calibration_fidelity.py [--log default|second]
        [--conditions traffic,sqrt,balanced,random,generic] [--seeds 0,1,2] [--samples 128] [--json OUT.jsonl]
    python benchmarks/calibration_fidelity.py --report OUT.jsonl [OUT2.jsonl ...]

Two logs, each built once into ``.cache/benchmarks/calibration-fidelity/`` (deterministic) and
split by content hash into a traffic log and a held-out evaluation log with no text in common
(checked):

- ``default``: the rows of the embedded default log (``calibration/default.jsonl``, 8 tasks from
  the offline corpora), ``EVAL_ROWS`` distinct rows per task held out, and a traffic log of
  ``TRAFFIC_ROWS`` requests drawn from the rest the way a service sees them: a few tasks carry
  most of the traffic with heavily repeated requests (a FAQ-like chat task of 60 distinct texts is
  28% of the requests), a rare long-document task (12 documents, 1%), and ``MALFORMED`` broken
  lines.
- ``second`` (``label_log``, in ``second/``): a sentiment classifier's traffic, 60% of the rows,
  whose replies are one word (positive, negative, neutral); the rest document QA, code,
  extraction, summarisation and math rows of the embedded default log, and a few documents of
  several thousand tokens. Held out: ``SECOND_EVAL_ROWS`` rows of each of those tasks,
  ``LABEL_EVAL_ROWS`` other reviews (a one-word reply scores about two tokens) and
  ``LONG_DOCUMENTS`` long documents joined from the held-out documents.

Conditions, each a GPTQ W4A16 g64 conversion of SmolLM2 (``w4a16-g64-gptq``: 128 samples of at
most 512 tokens) from ``--samples`` calibration texts:

- ``traffic``, ``sqrt``, ``balanced``: ``quantkit calibrate``'s allocation policies (allocate.py);
- ``random``: uniformly random lines of the log (repeats and all, as a user would cut a sample);
- ``generic``: windows of generic public text (the English Linux kernel documentation, the
  Debian ``linux-doc-6.1`` package, minus every file the default log's rows come from).

Each is evaluated as ``quantkit eval --calib`` would (business.py: through the chat template,
scoring the assistant turns) on the held-out log's task slices, generation left out; each
row's KL is kept for the report. One invocation runs its cells (``--cells``, or every condition
for each seed) one after another and runs the baseline's body once per batch for all of them. ``--report`` prints per log and per task the mean KL over seeds
with half the seed range, and each condition's difference from ``random`` with a 95% bootstrap
interval: per task over the held-out rows (paired: the same rows in both), for the mean over
tasks over seeds x rows; a policy beats random rows beyond noise where that interval lies below 0.
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
LOGS = ("default", "second")

# The second log (label_log): task -> share of the rows; "long_document" is LONG_DOCUMENTS rows.
LABEL_TRAFFIC = {"classification": 0.60, "qa_document": 0.09, "code": 0.08, "extraction": 0.08,
                 "summarisation": 0.08, "math": 0.07}
LONG_DOCUMENTS = 3
# Held out of the second log: rows per task, and classification rows (its replies are one word:
# enough rows to reach 1024 scored tokens)
SECOND_EVAL_ROWS = 80
LABEL_EVAL_ROWS = 512
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


def default_rows() -> dict[str, list[dict]]:
    """The embedded default log's rows by task."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for line in (ROOT / "calibration" / "default.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        by_task[rec["task"]].append(rec)
    return by_task


def long_documents(rng: random.Random, qa_rows: list[dict], n: int) -> list[dict]:
    """``n`` requests of several documents joined: a few thousand tokens each, no reply."""
    docs = [m["content"] for r in qa_rows for m in r["messages"] if m["role"] == "user"]
    return [{"task": "long_document", "messages": [{"role": "user", "content": "\n\n".join(rng.sample(docs, 6))
                                                    + "\n\nWhich of these documents is the longest, and what is it about?"}]}
            for _ in range(n)]


def label_log(rows: int = TRAFFIC_ROWS, seed: int = DATA_SEED, by_task: dict[str, list[dict]] | None = None) -> list[dict]:
    """The second log: ``rows`` records, classification-dominated (LABEL_TRAFFIC), in traffic order;
    its other tasks' rows drawn from ``by_task`` (the embedded default log's rows when None)."""
    rng = random.Random(seed)
    by_task = by_task or default_rows()
    out = [sentiment_row(rng) for _ in range(round(LABEL_TRAFFIC["classification"] * rows))]
    for task, share in LABEL_TRAFFIC.items():
        if task != "classification":
            out += [{"task": r["task"], "messages": r["messages"]} for r in rng.choices(by_task[task], k=round(share * rows))]
    out += long_documents(rng, by_task["qa_document"], LONG_DOCUMENTS)
    rng.shuffle(out)
    return out


def _content(record: dict) -> str:
    from quantkit.calibration.config import FieldMap
    from quantkit.calibration.render import render_record
    return render_record(0, record, FieldMap(), lambda messages: "").content


def build_logs(log: str = "default", folder: Path = CACHE) -> dict[str, Path]:
    """The traffic log, the held-out evaluation log and the generic text of ``log`` (built once):
    ``default`` in ``folder``, ``second`` (label_log's shape) in ``folder/second``."""
    if log not in LOGS:
        raise SystemExit(f"--log: unknown log {log!r} (expected {', '.join(LOGS)})")
    where = folder / "second" if log == "second" else folder
    paths = {"traffic": where / "traffic.jsonl", "eval": where / "eval.jsonl", "generic": folder / "generic.json"}
    if all(p.exists() for p in paths.values()):
        return paths
    where.mkdir(parents=True, exist_ok=True)
    by_task = default_rows()
    traffic, held = (_second_split if log == "second" else _default_split)(by_task)
    keys = lambda rows: {content_key(_content(r)) for r in rows if isinstance(r, dict)}   # noqa: E731
    leaked = keys(traffic) & keys(held)
    assert not leaked, f"{len(leaked)} evaluation texts in the traffic log"
    lines = [r if isinstance(r, str) else json.dumps({"task": r["task"], "messages": r["messages"]}, ensure_ascii=False)
             for r in traffic]
    paths["traffic"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths["eval"].write_text("\n".join(json.dumps({"task": r["task"], "messages": r["messages"]}, ensure_ascii=False)
                                       for r in held) + "\n", encoding="utf-8")
    if not paths["generic"].exists():
        paths["generic"].write_text(json.dumps(generic_documents(folder, by_task), ensure_ascii=False), encoding="utf-8")
    return paths


def content_key(text: str) -> str:
    from quantkit.calibration.dedup import content_key as key
    return key(text)


def _hold_out(rng: random.Random, rows: list[dict], n: int) -> tuple[list[dict], list[dict]]:
    """``n`` rows of a task held out, and the rest with none of their texts."""
    rows = rows[:]
    rng.shuffle(rows)
    held_keys = {content_key(_content(r)) for r in rows[:n]}
    return rows[:n], [r for r in rows[n:] if content_key(_content(r)) not in held_keys]


def _default_split(by_task: dict[str, list[dict]]) -> tuple[list, list[dict]]:
    """The first log: TRAFFIC's skewed requests plus MALFORMED broken lines (strings), and
    EVAL_ROWS held-out rows per task."""
    rng = random.Random(DATA_SEED)
    held, pools = [], {}
    for task in sorted(by_task):
        rows, pools[task] = _hold_out(rng, by_task[task], EVAL_ROWS)
        held += rows
    traffic = []
    for task, (share, distinct, zipf) in TRAFFIC.items():
        pool = pools[task][:distinct] if distinct else pools[task]
        weights = [1.0 / (k + 1) ** zipf for k in range(len(pool))]
        traffic += rng.choices(pool, weights=weights, k=round(share * TRAFFIC_ROWS))
    broken = ['{"task": "chat", "messages": [{"role": "user", "content": "cut off', '{"task": "chat"}',
              "[]", '{"messages": "not a list"}']
    traffic += [broken[i % len(broken)] for i in range(MALFORMED)]
    rng.shuffle(traffic)
    rng.shuffle(held)
    return traffic, held


def _second_split(by_task: dict[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    """The second log: label_log over the rows not held out; held out, SECOND_EVAL_ROWS rows of
    each other task, LABEL_EVAL_ROWS fresh reviews (a one-word reply scores about two tokens) and
    LONG_DOCUMENTS long documents joined from the held-out documents."""
    rng = random.Random(DATA_SEED + 1)
    held, pools = [], {}
    for task in sorted(LABEL_TRAFFIC):
        if task != "classification":
            rows, pools[task] = _hold_out(rng, by_task[task], SECOND_EVAL_ROWS)
            held += rows
    traffic = label_log(TRAFFIC_ROWS, DATA_SEED, pools)
    seen = {content_key(_content(r)) for r in traffic}
    reviews = []
    while len(reviews) < LABEL_EVAL_ROWS:   # order numbers make repeats rare; a repeat is drawn again
        row = sentiment_row(rng)
        if content_key(_content(row)) not in seen:
            seen.add(content_key(_content(row)))
            reviews.append(row)
    qa = [r for r in held if r["task"] == "qa_document"]
    held = reviews + held + long_documents(rng, qa, LONG_DOCUMENTS)
    rng.shuffle(held)
    return traffic, held


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
        from quantkit.calibration.calibration_set import calibrate
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
    from quantkit.inputs.embedded_model import default_model_dir
    from quantkit.recipe import load_recipe

    paths = build_logs(args.log)
    folder = default_model_dir()
    tok = load_tokenizer(folder)
    recipe = load_recipe(RECIPE)
    max_len = recipe.calibration.max_seq_len
    base = remember_body(load_model(folder))
    business = read_business(paths["eval"], tok, args.rows)
    opts = SuiteOptions(gen_prompts=0, business_rows=args.rows, business_tokens=args.row_tokens,
                        business_scored_tokens=args.scored_tokens)
    machine = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
               "torch": torch.__version__, "affinity": sorted(os.sched_getaffinity(0))}
    say = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    slice_of = {it["id"]: sl.name for sl in business.slices for it in sl.items}
    scored = record_rows()
    for done, (condition, seed) in enumerate(cells(args)):
        ids, mix = calibration_ids(condition, seed, paths, tok, args.samples, max_len)
        row = {"log": args.log, "condition": condition, "seed": seed, "samples": len(ids), "sample_tasks": mix,
               "sample_tokens": sum(map(len, ids)), "recipe": RECIPE, "machine": machine,
               "business": {"rows": args.rows, "row_tokens": args.row_tokens, "scored_tokens": args.scored_tokens}}
        with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as tmp:
            c0 = time.process_time()
            q = quantkit.quantize(folder, recipe, ids, quantkit.ConvertOptions(out=Path(tmp) / "ckpt", log=say))
            path = q.save()
            row["convert_cpu_s"] = round(time.process_time() - c0, 1)
            cand = load_model(path)
            c0 = time.process_time()
            scored.clear()
            result = evaluate(base, cand, tok, suite=business.slices, max_len=2048, options=opts, progress=False)
            row["eval_cpu_s"] = round(time.process_time() - c0, 1)
            row["baseline_body_reused"] = done > 0   # eval_cpu_s then leaves out the baseline's body
        row["slices"] = {name: {k: v[k] for k in ("kl_mean", "kl_mean_ci", "top1_agreement", "ppl_increase", "tokens")
                                if k in v} for name, v in result.slices.items()}
        row["rows"] = per_row(scored, slice_of)
        for name, rr in row["rows"].items():   # the rows recorded are the rows the slice was measured on
            got = sum(r[2] for r in rr) / sum(r[1] for r in rr)
            assert abs(got - row["slices"][name]["kl_mean"]) <= 1e-6 * max(1.0, got), (name, got)
        kls = [v["kl_mean"] for v in row["slices"].values()]
        row["kl_mean"] = sum(kls) / len(kls)
        say(f"{condition} seed {seed}: mean KL {row['kl_mean']:.4f} over {len(kls)} task slices")
        if args.json:
            with args.json.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def cells(args) -> list[tuple[str, int]]:
    """(condition, seed) in the order to run them: ``--cells`` as given, else every condition for
    each seed in turn."""
    if args.cells:
        out = []
        for cell in args.cells.split(","):
            condition, _, seed = cell.partition(":")
            if condition not in CONDITIONS or not seed.isdigit():
                raise SystemExit(f"--cells: {cell!r} is not CONDITION:SEED (conditions: {', '.join(CONDITIONS)})")
            out.append((condition, int(seed)))
        return out
    return [(c, int(s)) for s in args.seeds.split(",") for c in args.conditions.split(",")]


def remember_body(model):
    """``model`` with its body's hidden states kept per batch of token ids: the baseline scores
    the same held-out rows in the same batches for every condition and seed, so its body runs
    once per batch in this process and each later condition only runs its head (the same
    float32 states, so every figure is what a fresh run gives)."""
    import hashlib

    import torch

    prefix = model.base_model_prefix
    body = getattr(model, prefix)
    kept: dict[str, object] = {}

    class Remembered(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = body

        def forward(self, input_ids, attention_mask=None, **kw):
            h = hashlib.sha256(input_ids.cpu().numpy().tobytes())
            if attention_mask is not None:
                h.update(attention_mask.cpu().numpy().tobytes())
            key = f"{tuple(input_ids.shape)}:{h.hexdigest()}"
            if key not in kept:
                kept[key] = self.inner(input_ids=input_ids, attention_mask=attention_mask, **kw)
            return kept[key]

    setattr(model, prefix, Remembered())
    return model


def record_rows() -> list:
    """Every row the in-process backend scores teacher-forced from now on (its ItemStats), in a
    list the caller clears; the evaluation's result keeps only each slice's totals and interval,
    and the paired differences between conditions need each row's KL."""
    from quantkit.evaluation import evaluator as api
    from quantkit.evaluation.backends.in_process import InProcessBackend

    seen: list = []

    class Recording(InProcessBackend):
        def teacher_forced(self, encoded, request, views=None):
            out = super().teacher_forced(encoded, request, views)
            seen.extend(out.items)
            return out

    api.InProcessBackend = Recording
    return seen


def per_row(items: list, slice_of: dict[str, str]) -> dict[str, list[list]]:
    """slice -> [row id, scored tokens, KL summed over them] for each scored row, by row id."""
    out: dict[str, list[list]] = defaultdict(list)
    for s in items:
        if s.item_id in slice_of and s.tokens:
            out[slice_of[s.item_id]].append([s.item_id, s.tokens, s.kl_sum])
    return {k: sorted(v) for k, v in sorted(out.items())}


def load_runs(files: list[Path]) -> dict[str, dict[str, dict[int, dict]]]:
    """log -> condition -> seed -> the run's JSON line (the last one of each cell)."""
    by: dict[str, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                by[r.get("log", "default")][r["condition"]][r["seed"]] = r
    return by


def row_matrix(runs: dict[int, dict], task: str, ids: list[str]):
    """KL summed over each row's scored tokens, seeds x rows (rows in the order of ``ids``)."""
    import numpy as np

    out = []
    for r in runs.values():
        kl = {i: k for i, _, k in r["rows"][task]}
        out.append([kl[i] for i in ids])
    return np.asarray(out, dtype=np.float64)


def difference(a: dict[int, dict], b: dict[int, dict], tasks: list[str]) -> dict:
    """``a`` minus ``b`` in mean KL (the mean over seeds of each task's KL per scored token): per
    task, its 95% bootstrap interval over the task's rows (the same rows in both, paired); for the
    mean over tasks, over seeds (each side's own) x rows."""
    import numpy as np

    from quantkit.evaluation.bootstrap import LEVEL, REPLICATES, SEED, ratio_interval

    out, mats = {"tasks": {}}, []
    for t in tasks:
        ids = [i for i, _, _ in next(iter(a.values()))["rows"][t]]
        tokens = np.asarray([n for _, n, _ in next(iter(a.values()))["rows"][t]], dtype=np.float64)
        ka, kb = row_matrix(a, t, ids), row_matrix(b, t, ids)
        d = ka.mean(axis=0) - kb.mean(axis=0)
        out["tasks"][t] = {"diff": float(d.sum() / tokens.sum()), "ci": ratio_interval(d, tokens)}
        mats.append((ka, kb, tokens))
    rng = np.random.default_rng(SEED)
    reps = np.zeros(REPLICATES)
    for ka, kb, tokens in mats:
        rows = rng.integers(0, tokens.size, size=(REPLICATES, tokens.size))
        sa = rng.integers(0, ka.shape[0], size=(REPLICATES, ka.shape[0]))
        sb = rng.integers(0, kb.shape[0], size=(REPLICATES, kb.shape[0]))
        den = tokens[rows].sum(axis=1)
        per_a = np.stack([ka[:, r].sum(axis=1) for r in rows])     # replicate x seed
        per_b = np.stack([kb[:, r].sum(axis=1) for r in rows])
        reps += (np.take_along_axis(per_a, sa, 1).mean(1) - np.take_along_axis(per_b, sb, 1).mean(1)) / den
    reps /= len(mats)
    lo, hi = np.quantile(reps, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    out["mean"] = {"diff": sum(v["diff"] for v in out["tasks"].values()) / len(tasks), "ci": (float(lo), float(hi))}
    return out


def _signed(d: dict) -> str:
    lo, hi = d["ci"] or (float("nan"), float("nan"))
    return f"{d['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def verdict(d: dict) -> str:
    """Below zero beyond noise (the interval's top under 0), above it, or within noise."""
    lo, hi = d["ci"] or (float("-inf"), float("inf"))
    return "lower beyond noise" if hi < 0 else "higher beyond noise" if lo > 0 else "within noise"


def beats_random(by: dict[str, dict[int, dict]], condition: str) -> str:
    """Whether ``condition`` beats random rows beyond noise on one log's runs: the mean over tasks'
    interval below 0, with at least two seeds on each side (one seed's interval holds the rows'
    noise only, not the draw's)."""
    seeds = min(len(by[condition]), len(by["random"]))
    tasks = sorted(next(iter(by[condition].values()))["slices"])
    v = verdict(difference(by[condition], by["random"], tasks)["mean"])
    if seeds < 2:
        return f"undecided: one seed ({v} over the rows alone)"
    if v == "lower beyond noise":
        return "BEATS random rows beyond noise"
    return "does not beat random rows beyond noise" + (" (worse beyond noise)" if v == "higher beyond noise" else "")


def report_log(log: str, by: dict[str, dict[int, dict]]) -> None:
    """One log's tables: mean KL per task over seeds +- half the seed range, and each condition's
    difference from random rows with its bootstrap interval; then what beats random rows."""
    conds = [c for c in CONDITIONS if c in by]
    tasks = sorted(next(iter(by[conds[0]].values()))["slices"])
    mean = lambda xs: sum(xs) / len(xs)   # noqa: E731
    first = next(iter(by[conds[0]].values()))
    print(f"## log: {log} (business {first['business']})\n")
    print("| task slice | " + " | ".join(f"{c} ({len(by[c])} seeds)" for c in conds) + " |")
    print("| --- |" + " --- |" * len(conds))
    for t in tasks:
        cells = [[r["slices"][t]["kl_mean"] for r in by[c].values()] for c in conds]
        print(f"| {t} | " + " | ".join(f"{mean(v):.4f} +- {(max(v) - min(v)) / 2:.4f}" for v in cells) + " |")
    means = {c: [r["kl_mean"] for r in by[c].values()] for c in conds}
    print("| **mean over tasks** | " + " | ".join(f"**{mean(v):.4f}** ({', '.join(f'{x:.4f}' for x in v)})"
                                                for v in means.values()) + " |")
    if "random" not in by:
        print("\nrandom rows not measured on this log: no differences\n")
        return
    diffs = {c: difference(by[c], by["random"], tasks) for c in conds if c != "random"}
    print("\nDifference from random rows in mean KL, 95% bootstrap interval (per task over rows; "
          "the mean over seeds x rows):\n")
    print("| task slice | " + " | ".join(f"{c} - random" for c in diffs) + " |")
    print("| --- |" + " --- |" * len(diffs))
    for t in tasks:
        print(f"| {t} | " + " | ".join(_signed(d["tasks"][t]) for d in diffs.values()) + " |")
    print("| **mean over tasks** | " + " | ".join(f"**{_signed(d['mean'])}**" for d in diffs.values()) + " |\n")
    for c, d in diffs.items():
        below = sum(verdict(v) == "lower beyond noise" for v in d["tasks"].values())
        above = [t for t, v in d["tasks"].items() if verdict(v) == "higher beyond noise"]
        print(f"- {c}: {beats_random(by, c)} on the mean over tasks ({_signed(d['mean'])}); lower beyond noise on "
              f"{below} of {len(tasks)} task slices, higher on {', '.join(above) or 'none'}")
    if "generic" in by and DEFAULT in by:
        g = difference(by["generic"], by[DEFAULT], tasks)
        worse = sum(verdict(v) == "higher beyond noise" for v in g["tasks"].values())
        print(f"- generic - {DEFAULT}: {_signed(g['mean'])} on the mean ({verdict(g['mean'])}), "
              f"{mean(means['generic']) / mean(means[DEFAULT]):.2f}x its mean KL; higher beyond noise on {worse} of {len(tasks)}")
    print()
    for c in conds:
        mix = Counter()
        for rr in by[c].values():
            mix.update(rr["sample_tasks"])
        print(f"{c}: samples per task over {len(by[c])} seeds {dict(mix)}; convert "
              f"{statistics.median(x['convert_cpu_s'] for x in by[c].values()):.0f} CPU s, eval "
              f"{statistics.median(x['eval_cpu_s'] for x in by[c].values()):.0f} CPU s (median)")
    print()


def report(files: list[Path]) -> None:
    by = load_runs(files)
    for log in LOGS:
        if log in by:
            report_log(log, by[log])
        else:
            print(f"## log: {log}: not measured\n")
    for c in ("traffic", "sqrt", "balanced"):
        print(f"{c} against random rows: " + "; ".join(
            f"{log}: {beats_random(by[log], c) if c in by.get(log, {}) and 'random' in by[log] else 'not measured'}"
            for log in LOGS))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default="default", choices=LOGS, help="which traffic log")
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cells", default="", help="CONDITION:SEED,... to run in this order (overrides --conditions/--seeds)")
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
        paths = build_logs(args.log)
        for k, p in paths.items():
            print(k, p, p.stat().st_size)
    else:
        run(args)


if __name__ == "__main__":
    main()
