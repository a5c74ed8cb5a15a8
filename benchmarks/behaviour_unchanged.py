"""Check: two quantkit versions write the same checkpoints and the same report figures.

    python benchmarks/behaviour_unchanged.py BASE_OUT NEW_OUT

Each of BASE_OUT and NEW_OUT holds what one version wrote on the embedded default, from its own
checkout (``PYTHONPATH=<checkout>``, same machine, ``OMP_NUM_THREADS=2``):

    quantkit convert --recipe R --no-eval --out OUT/R      for R in w8a16 w4a16-g64 fp8-dynamic w8a8
    quantkit convert --recipe w4a16-g64-gptq --out OUT/w4a16-g64-gptq   (with its evaluation)

Every tensor is compared by name (whatever the shard layout) through its dtype, shape and
its bytes' sha256 (tests/golden/tensor_digests.py), and
``w4a16-g64-gptq/eval/report.json`` value by value with the key order ignored and the timing
fields (seconds, free memory, paths) left out. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the tiny-model golden check's digest: dtype, shape and the bytes' sha256 of each tensor by name
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "golden"))
from tensor_digests import digests  # noqa: E402

RECIPES = ("w8a16", "w4a16-g64", "fp8-dynamic", "w8a8", "w4a16-g64-gptq")
# Fields that measure the run, not the model: wall and CPU time, free memory, where it ran.
VOLATILE = {"seconds_per_slice", "cpu_seconds_per_slice", "seconds_total", "cpu_seconds_total", "free_gib",
            "integrity_seconds", "seconds", "baseline", "candidate"}


def differences(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ, the volatile keys left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted((set(a) | set(b)) - VOLATILE):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'the new' if k not in a else 'the base'} report")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", type=Path, help="what the baseline version wrote")
    ap.add_argument("new", type=Path, help="what the new version wrote")
    args = ap.parse_args()
    same = True
    for r in RECIPES:
        a, b = digests(args.base / r), digests(args.new / r)
        differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        same &= not differ
        print(f"{r}: {len(a)} tensors, {len(differ)} differ" + (f" (first: {differ[0]})" if differ else ""))
    ra, rb = (json.loads((d / "w4a16-g64-gptq" / "eval" / "report.json").read_text()) for d in (args.base, args.new))
    diff = differences(ra, rb)
    same &= not diff
    print(f"report.json: {len(diff)} differences; decision {ra.get('decision')} -> {rb.get('decision')}")
    for d in diff[:20]:
        print("  " + d)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
