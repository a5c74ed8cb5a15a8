"""benchmarks/gpu_check.sh --dry-run: every stage of the GPU check on the CPU, tiny shapes, the
kernels interpreted; the JSON and the Markdown hold a finite figure for every requested shape."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("W4A16", "FP8", "INT8")
M_VALUES, KN = (1, 16), (256, 128)            # the dry run's shapes (gpu_check.sh)
ROW_FIELDS = ("ms", "tflops", "gbs", "dense_ms", "speedup", "bw_nominal", "bw_copy")


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "QUANTKIT_BACKEND")}
    env.update(OUT=str(out), PYTHON=sys.executable)
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=600)
    return res, out


def test_dry_run_passes_every_stage(dry_run):
    res, out = dry_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["ok"] and doc["failed_stages"] == [] and doc["mode"] == "dry-run"
    assert [s["stage"] for s in doc["stages"]] == ["env", "tests", "kernels", "gptq", "eval"]
    assert all(s["rc"] == 0 and finite(s["seconds"]) for s in doc["stages"])
    assert doc["env"]["TRITON_INTERPRET"] == "1" and doc["env"]["imports"]["quantkit"] == "ok"
    # the engine path this machine would take, as the engine contract reads the host (a CPU here)
    serving = doc["env"]["serving"]
    assert "AMX" in serving["host"] and serving["dtype"]["W4A16"] == "bfloat16" and not serving["fp8_tensor_cores"]
    t = doc["tests"]
    assert t["passed"] > 0 and t["failures"] == t["errors"] == 0, t


def test_kernel_table_has_every_shape(dry_run):
    _, out = dry_run
    doc = json.loads((out / "gpu_check.json").read_text())
    rows = {(r["kernel"], r["M"], r["K"], r["N"]): r for r in doc["kernels"]["rows"]}
    assert set(rows) == {(k, m, *KN) for k in KERNELS for m in M_VALUES}
    for key, r in rows.items():
        bad = [f for f in ROW_FIELDS if not (finite(r[f]) and r[f] > 0)]
        assert not bad, (key, bad)
    md = (out / "gpu_check.md").read_text()
    for k in KERNELS:
        for m in M_VALUES:
            assert f"| {k} | {m} | {KN[0]}x{KN[1]} |" in md


def test_gptq_and_eval_sections(dry_run):
    _, out = dry_run
    doc = json.loads((out / "gpu_check.json").read_text())
    g = doc["gptq"]
    assert len(g["per_layer_s"]) == g["model"]["layers"] == 1
    assert all(finite(x) and x > 0 for x in g["per_layer_s"] + [g["total_s"], g["est_32_layers_s"]])
    assert g["est_32_layers_s"] > g["total_s"]
    assert g["summary"]["quantized_modules"] == 7
    e = doc["eval"]
    assert e["backend"] == "triton" and e["decision"] in ("GO", "REVIEW", "NO-GO")
    assert set(e["slices"]) == {"numbers-en", "code-en"}
    for name, vals in e["slices"].items():
        assert {"kl_mean", "top1_agreement", "ppl_base", "ppl_cand"} <= set(vals), name
        assert all(finite(v) for v in vals.values()), (name, vals)
    md = (out / "gpu_check.md").read_text()
    assert "| layer 0 |" in md and "| estimate for 32 layers |" in md
    assert "| numbers-en |" in md and "| code-en |" in md
    assert (out / "parts" / "eval_report.md").read_text().startswith("# quantkit evaluation")


def test_failed_stages_are_named_and_the_rest_still_run(tmp_path):
    """Every stage cut off by its time limit: each is still run and recorded, the report keeps
    every section with the error and the log's tail, and the script exits 1 naming them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OUT=str(tmp_path), PYTHON=sys.executable,
               **{f"GPU_CHECK_LIMIT_{s}": "1" for s in ("ENV", "TESTS", "KERNELS", "GPTQ", "EVAL")})
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAILED stages: env tests kernels gptq eval" in res.stderr
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["failed_stages"] == ["env", "tests", "kernels", "gptq", "eval"] and not doc["ok"]
    for name in ("env", "tests", "kernels", "gptq", "eval"):
        assert "timed out" in doc[name]["stage_error"] and "log_tail" in doc[name], name
        # The kernel table is written row by row: on a fast machine a row can finish inside the
        # limit, and a table cut short keeps its rows instead of an error.
        kept_rows = name == "kernels" and bool(doc[name].get("rows"))
        assert kept_rows or "error" in doc[name], name
    assert "FAILED: env, tests, kernels, gptq, eval" in (tmp_path / "gpu_check.md").read_text()
