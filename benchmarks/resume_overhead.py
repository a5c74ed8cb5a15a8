"""What resume bookkeeping costs a conversion (pipeline/resume.py).

Converts a model for an output folder (so every layer boundary is committed: the hidden
states, the writer's pending tensors, the manifest) and reports the seconds spent in
``RunBook.commit`` and in ``run_keys`` (the manifest's hashes) against the whole run, plus
the bytes the bookkeeping wrote. Timing the bookkeeping inside one run, rather than two runs
against each other, keeps the figure clear of the noise of a shared machine.

    python benchmarks/resume_overhead.py [--model DIR] [--recipe w4a16-g64-gptq] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import quantkit
from quantkit.pipeline import resume


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--recipe", default="w4a16-g64-gptq")
    ap.add_argument("--calib", default=None, help="calibration source (default: the recipe's / the default log)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    spent = {"commit": 0.0, "keys": 0.0, "commits": 0, "bytes": 0}
    commit, keys = resume.RunBook.commit, resume.run_keys

    def timed_commit(self, *a, **k):
        before = set(self.last.writer["parts"]) if self.last else set()
        t = time.perf_counter()
        commit(self, *a, **k)
        spent["commit"] += time.perf_counter() - t
        spent["commits"] += 1
        new = [self.last.state, *(n for n in self.last.writer["parts"] if n not in before)]
        spent["bytes"] += sum((self.run_dir / n).stat().st_size for n in new)

    def timed_keys(*a, **k):
        t = time.perf_counter()
        out = keys(*a, **k)
        spent["keys"] += time.perf_counter() - t
        return out

    resume.RunBook.commit = timed_commit
    import quantkit.workflows.convert as api
    api.run_keys = timed_keys
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        t0 = time.perf_counter()
        q = quantkit.quantize(args.model, args.recipe, args.calib, quantkit.ConvertOptions(out=Path(tmp) / "out"))
        total = time.perf_counter() - t0
        q.save()
    row = {"recipe": args.recipe, "total_s": round(total, 2), "commit_s": round(spent["commit"], 3),
           "keys_s": round(spent["keys"], 3), "commits": spent["commits"],
           "bookkeeping_mb_written": round(spent["bytes"] / 1e6, 1),
           "overhead_pct": round(100 * (spent["commit"] + spent["keys"]) / total, 2)}
    print(json.dumps(row) if args.json else
          f"{row['recipe']}: {row['total_s']} s in all; bookkeeping {row['commit_s']} s in {row['commits']} commits "
          f"+ {row['keys_s']} s of keys ({row['overhead_pct']}%), {row['bookkeeping_mb_written']} MB written")


if __name__ == "__main__":
    main()
