"""The manifest: everything needed to audit a calibration set, as plain JSON-ready data.

Counts and statistics only, never calibration text. Key order and float rounding are fixed so
that one seed gives byte-identical files.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable

import numpy as np

from quantkit.calibration.config import SamplerConfig
from quantkit.calibration.dedup import content_key
from quantkit.calibration.io import Malformed
from quantkit.calibration.sampler import Pool, Selection, bucket_index

MANIFEST_FORMAT = "quantkit-calibration"
MANIFEST_VERSION = 2  # 2: traffic (repeats counted) beside distinct rows; sample content hashes
SHARE_DIGITS = 6
CONTENT_HASH = "blake2b-128 of the row's content (NFKC, case folded, whitespace collapsed)"
# A sample below this many effective task types (exp of the entropy of its task shares: 1.0 for
# one task, k for k equal ones) is narrow: calibrated on one kind of text, a low-bit model loses
# quality on the others (benchmarks/RESULTS.md, "Narrow calibration sets").
NARROW_TASK_TYPES = 2.0
RAW_TEXT = "text"   # tasks.infer_task's type for raw text rows (no request): generic text, not traffic


def histogram_edges(max_len: int) -> list[int]:
    """Token-length histogram bins: (0, 16], (16, 32], ... doubling, the last ending at max_len."""
    edges, e = [], 16
    while e < max_len:
        edges.append(e)
        e *= 2
    return edges + [max_len]


def _histogram(lengths: np.ndarray, edges: list[int], weights: np.ndarray | None = None) -> list[int]:
    counts = np.bincount(bucket_index(lengths, edges), weights=weights, minlength=len(edges))
    return np.rint(counts).astype(int).tolist()


def _share(part: int, whole: int) -> float:
    return round(part / whole, SHARE_DIGITS) if whole else 0.0


def _sorted_counts(values: list[str]) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))


def build_manifest(*, source: dict[str, Any], tokenizer_info: dict[str, Any], cfg: SamplerConfig,
                   rows_read: int, malformed: Malformed, pool: Pool, selection: Selection,
                   warnings: list[str]) -> dict[str, Any]:
    picked = selection.indices
    n_pool, n_sel = len(pool.rows), len(picked)
    n_traffic = int(pool.traffic.sum())
    traffic = pool.cell_traffic()
    cell_rows = []
    # by task, then by length in numbers ("65-128" before "129-256"), not as text
    for c, ix in sorted(pool.cells().items(), key=lambda kv: (kv[0][0], pool.labels.index(kv[0][1]))):
        cell_rows.append({
            "task": c[0], "bucket": c[1],
            "traffic_rows": traffic[c], "traffic_share": _share(traffic[c], n_traffic),
            "distinct_rows": len(ix), "distinct_share": _share(len(ix), n_pool),
            "target": selection.targets[c], "target_share": _share(selection.targets[c], cfg.num_samples),
            "selected": selection.selected[c], "sample_share": _share(selection.selected[c], n_sel),
        })
    sel_tasks = [pool.tasks[i] for i in picked]
    sel_buckets = [pool.labels[pool.buckets[i]] for i in picked]
    copies = pool.traffic.tolist()
    hist_edges = histogram_edges(cfg.max_len)
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "source": source,
        "tokenizer": tokenizer_info,
        "config": cfg.to_dict(),
        "counts": {
            "rows_read": rows_read,
            "malformed": malformed.total,
            "valid": n_pool + pool.duplicates_exact + pool.dropped_long,
            "duplicates_exact": pool.duplicates_exact,
            "dropped_too_long": pool.dropped_long,
            "pool": n_pool,
            "duplicates_near": selection.duplicates_near,
            "selected": n_sel,
            "truncated_source": int(pool.truncated.sum()),
            "truncated_selected": int(sum(bool(pool.truncated[i]) for i in picked)),
            "tokens_selected": int(sum(len(ids) for ids in selection.ids)),
        },
        "malformed": malformed.to_dict(),
        "task_source": {
            "source": _sorted_counts(pool.task_from),
            "sample": _sorted_counts([pool.task_from[i] for i in picked]),
        },
        "bucket_labels": pool.labels,
        "cells": cell_rows,
        "tasks": _marginal(pool.tasks, copies, sel_tasks),
        "buckets": _marginal([pool.labels[b] for b in pool.buckets], copies, sel_buckets, order=pool.labels),
        "length_histogram": {
            "edges": hist_edges,
            "traffic": _histogram(pool.lengths, hist_edges, pool.traffic.astype(np.float64)),
            "distinct": _histogram(pool.lengths, hist_edges),
            "sample": _histogram(np.asarray([len(ids) for ids in selection.ids], dtype=np.int64),
                                 hist_edges),
        },
        "task_coverage": task_coverage(pool, selection),
        "languages": {
            "source": _sorted_counts(pool.languages),
            "sample": _sorted_counts([pool.languages[i] for i in picked]),
        },
        "warnings": warnings,
        # hashes, never text: what an evaluation must leave out of its business rows
        "sample_content": {"hash": CONTENT_HASH,
                           "selected": sorted({content_key(pool.rows[i].content) for i in picked})},
    }


def _marginal(source: list[str], copies: list[int], sample: list[str],
              order: list[str] | None = None) -> list[dict[str, Any]]:
    src, smp, traffic = Counter(source), Counter(sample), Counter()
    for k, n in zip(source, copies):
        traffic[k] += n
    total = sum(copies)
    keys = [k for k in order if k in src] if order else sorted(src)
    return [{"name": k, "traffic_rows": traffic[k], "traffic_share": _share(traffic[k], total),
             "distinct_rows": src[k], "distinct_share": _share(src[k], len(source)),
             "selected": smp[k], "sample_share": _share(smp[k], len(sample))} for k in keys]


def effective_task_types(counts: Iterable[int]) -> float:
    """exp of the Shannon entropy of the shares ``counts`` make: how many equally used task types
    a mix is worth.

    >>> effective_task_types([128]), effective_task_types([64, 64]), round(effective_task_types([120, 8]), 3)
    (1.0, 2.0, 1.263)
    """
    counts = [c for c in counts if c > 0]
    total = sum(counts)
    return math.exp(-sum(c / total * math.log(c / total) for c in counts)) if total else 0.0


def narrow_warning(tasks: list[str], raw_text: list[bool]) -> str | None:
    """The warning for a sample of few task types (``tasks``: each sample row's task type;
    ``raw_text``: whether a row is raw text whose type was inferred), or None. A sample of raw
    text only is generic text the user chose, not a narrow cut of traffic: no warning."""
    if not tasks or all(raw_text):
        return None
    counts = Counter(tasks)
    effective = effective_task_types(counts.values())
    if effective >= NARROW_TASK_TYPES:
        return None
    shown = ", ".join(f"{t} {n}" for t, n in counts.most_common())
    types = "task type" if len(counts) == 1 else "task types"
    return (f"narrow calibration set: the sample covers {len(counts)} {types} ({shown}), "
            f"{effective:.2f} effective (< {NARROW_TASK_TYPES:g}); calibrated on one kind of text, a low-bit model "
            "can lose quality on every other kind it serves: add traffic of its other tasks, and check the "
            "verdict on their slices (--calib)")


def task_coverage(pool: Pool, selection: Selection) -> dict[str, Any]:
    """How many task types the sample holds, effective and of the log's."""
    picked = [pool.tasks[i] for i in selection.indices]
    return {"task_types": len(set(picked)), "log_task_types": len(set(pool.tasks)),
            "effective_task_types": round(effective_task_types(Counter(picked).values()), 3),
            "narrow_below": NARROW_TASK_TYPES}


def coverage_warnings(pool: Pool, selection: Selection, cfg: SamplerConfig) -> list[str]:
    """A sample of few task types, thin cells (few source rows), cells left out, and a set
    smaller than asked."""
    narrow = narrow_warning([pool.tasks[i] for i in selection.indices],
                            [pool.tasks[i] == RAW_TEXT and pool.task_from[i] == "inferred"
                             for i in selection.indices])
    out = [narrow] if narrow else []
    traffic, total = pool.cell_traffic(), max(int(pool.traffic.sum()), 1)
    for c, ix in pool.cells().items():
        if len(ix) < cfg.warn_below_rows:
            out.append(f"cell {c[0]} x {c[1]}: only {len(ix)} distinct rows (< {cfg.warn_below_rows}); "
                       "collect more traffic of this kind")
        wanted = cfg.num_samples * traffic[c] / total if cfg.policy == "traffic" else 0.0
        if selection.selected[c] == len(ix) and wanted >= len(ix) + 1:
            out.append(f"cell {c[0]} x {c[1]}: all {len(ix)} distinct rows drawn, its traffic share asked for "
                       f"{wanted:.0f} (its requests repeat); the rest went to other cells")
        if selection.selected[c] == 0:
            out.append(f"cell {c[0]} x {c[1]}: not represented (num_samples too small for all cells)")
    if len(selection.indices) < cfg.num_samples:
        out.append(f"selected {len(selection.indices)} samples, fewer than the {cfg.num_samples} asked: "
                   "the log has no more distinct rows")
    return out
