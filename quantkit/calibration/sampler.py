"""Stratified sampling over (task type x length bucket) cells.

``build_pool`` turns rendered rows into a pool (exact duplicates removed, token lengths,
cells); ``draw`` picks the calibration set from it. Both are deterministic functions of their
inputs and the seed: cells are visited in sorted order and each cell's rows are shuffled by one
``numpy`` generator seeded with ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from quantkit.calibration.allocate import allocate
from quantkit.calibration.config import SamplerConfig
from quantkit.calibration.dedup import NearDuplicateIndex, minhash, occurrences
from quantkit.calibration.encoding import (Affixes, count_tokens, encode_ids, truncate,
                                           with_affixes)
from quantkit.calibration.language import detect_language
from quantkit.calibration.render import Row
from quantkit.calibration.task_types import infer_task, user_labels

Cell = tuple[str, str]  # (task type, length-bucket label)


def bucket_labels(edges: Sequence[int]) -> list[str]:
    lows = [1] + [e + 1 for e in edges[:-1]]
    return [f"{lo}-{hi}" for lo, hi in zip(lows, edges)]


def bucket_index(lengths: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """Bucket of each (already capped) length: bucket i holds (edges[i-1], edges[i]]."""
    return np.searchsorted(np.asarray(edges), lengths, side="left")


@dataclass
class Pool:
    rows: list[Row]
    tasks: list[str]
    task_from: list[str]           # "field" | "inferred"
    languages: list[str]
    lengths: np.ndarray            # token count capped at max_len (what a sample will hold)
    truncated: np.ndarray          # bool: the row is longer than max_len
    buckets: np.ndarray            # index into labels
    labels: list[str]
    duplicates_exact: int
    dropped_long: int
    traffic: np.ndarray            # rows of the log each distinct row stands for (itself + its repeats)

    def cell(self, i: int) -> Cell:
        return (self.tasks[i], self.labels[self.buckets[i]])

    def cells(self) -> dict[Cell, list[int]]:
        out: dict[Cell, list[int]] = {}
        for i in range(len(self.rows)):
            out.setdefault(self.cell(i), []).append(i)
        return dict(sorted(out.items()))

    def cell_traffic(self) -> dict[Cell, int]:
        """Rows of the log per cell, repeats counted (what the server sees)."""
        return {c: int(self.traffic[ix].sum()) for c, ix in self.cells().items()}


def build_pool(rows: list[Row], tokenizer: Any, cfg: SamplerConfig, affixes: Affixes) -> Pool:
    kept, copies = occurrences([r.text for r in rows])
    duplicates = len(rows) - len(kept)
    rows, traffic = [rows[i] for i in kept], np.asarray(copies, dtype=np.int64)
    counts = count_tokens(tokenizer, [r.text for r in rows], cfg.max_len, affixes)
    too_long = counts > cfg.max_len
    dropped = 0
    if cfg.long_policy == "drop":
        keep = np.flatnonzero(~too_long)
        dropped = len(rows) - len(keep)
        rows, counts, too_long, traffic = [rows[i] for i in keep], counts[keep], too_long[keep], traffic[keep]
    inferred = [None if r.task is not None else infer_task(r.instruction, r.shape) for r in rows]
    tasks = user_labels([r.task for r in rows], inferred)
    task_from = ["inferred" if r.task is None else "field" for r in rows]
    edges = cfg.bucket_edges()
    lengths = np.minimum(counts, cfg.max_len)
    return Pool(rows=rows, tasks=tasks, task_from=task_from,
                languages=[detect_language(r.instruction) for r in rows],
                lengths=lengths, truncated=too_long, buckets=bucket_index(lengths, edges),
                labels=bucket_labels(edges), duplicates_exact=duplicates, dropped_long=dropped,
                traffic=traffic)


@dataclass
class Selection:
    indices: list[int]             # pool indices, grouped by cell (sorted), in draw order
    ids: list[list[int]]           # token ids (affixes applied, truncated to max_len)
    targets: dict[Cell, int]       # first allocation, before near duplicates thinned any cell
    selected: dict[Cell, int]
    duplicates_near: int


def draw(pool: Pool, tokenizer: Any, cfg: SamplerConfig, affixes: Affixes) -> Selection:
    cells = pool.cells()
    traffic = pool.cell_traffic()
    rng = np.random.default_rng(cfg.seed)
    order = {c: [ix[j] for j in rng.permutation(len(ix))] for c, ix in cells.items()}
    pointer = {c: 0 for c in cells}
    chosen: dict[Cell, list[tuple[int, list[int]]]] = {c: [] for c in cells}
    capacity = {c: len(ix) for c, ix in cells.items()}  # distinct rows: no text drawn twice
    near = NearDuplicateIndex(cfg.near_dup_threshold)
    near_count = 0
    targets: dict[Cell, int] | None = None
    while True:
        quotas = allocate(traffic, cfg.num_samples, cfg.policy, cfg.min_per_cell, capacity)
        targets = targets or quotas
        exhausted = False
        for c in cells:
            while len(chosen[c]) < quotas[c] and pointer[c] < len(order[c]):
                i = order[c][pointer[c]]
                pointer[c] += 1
                ids = truncate(with_affixes(encode_ids(tokenizer, [pool.rows[i].text])[0], affixes),
                               cfg.max_len, affixes)
                signature = minhash(ids)
                if near.is_near_duplicate(signature):
                    near_count += 1
                    continue
                near.add(signature)
                chosen[c].append((i, ids))
            if len(chosen[c]) < quotas[c]:
                capacity[c] = len(chosen[c])  # the cell ran dry: give its remainder to others
                exhausted = True
        if not exhausted:
            break
    picked = [item for c in cells for item in chosen[c]]
    return Selection(indices=[i for i, _ in picked], ids=[ids for _, ids in picked],
                     targets={c: targets.get(c, 0) for c in cells},
                     selected={c: len(chosen[c]) for c in cells}, duplicates_near=near_count)
