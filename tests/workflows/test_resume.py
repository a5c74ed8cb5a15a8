"""Killed conversions continue with --resume and give an uninterrupted run's bytes.

Each run is a real `quantkit convert` process on a tiny random Llama (4 layers) that
kills itself at a named point (``QUANTKIT_TEST_KILL_AT``, quantkit/common/crashpoints.py), so the
kill lands at the same place every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from model_factory import make_llama_dir, save_byte_tokenizer

LAYERS = 4


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _staging(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.startswith(".quantkit-tmp-"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    import pydoc_data.topics

    root = tmp_path_factory.mktemp("resume")
    model = make_llama_dir(root / "model", num_layers=LAYERS, vocab=260)
    save_byte_tokenizer(model)
    (root / "calib.txt").write_text("\n\n".join(list(pydoc_data.topics.topics.values())[:40]), encoding="utf-8")
    shipped = (Path(__file__).resolve().parents[2] / "recipes" / "w4a16-gptq.yaml").read_text()
    # hidden states on disk, several batches of them, GPTQ re-running the layer per sub-group
    (root / "offload.yaml").write_text(shipped.replace("calibration: {", "calibration: {offload: true, batch_tokens: 80, "))
    return root


def convert(work: Path, out: str, *extra: str, kill_at: str | None = None, signal_name: str = "KILL",
            recipe: str = "w4a16-gptq", calib: str = "calib.txt"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTKIT_TEST_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if kill_at:
        env.update(QUANTKIT_TEST_KILL_AT=kill_at, QUANTKIT_TEST_KILL_SIGNAL=signal_name)
    args = ["convert", "model", "--recipe", recipe, "--calib", calib, "--num-samples", "8",
            "--max-seq-len", "64", "--out", out, "--no-eval", *extra]
    if "--group-size" not in extra:
        args += ["--group-size", "32"]
    return subprocess.run([sys.executable, "-m", "quantkit.cli", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def reference(work) -> dict[str, str]:
    res = convert(work, "ref")
    assert res.returncode == 0, res.stderr
    return _files(work / "ref")


@pytest.mark.parametrize("kill_at", ["layer:0", "layer:2", "shard:last"],
                         ids=["before-first-layer", "mid-way", "writing-last-shard"])
def test_sigkilled_gptq_conversion_resumes_to_the_same_bytes(work, reference, kill_at):
    out = f"out-{kill_at.replace(':', '-')}"
    killed = convert(work, out, kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (work / out).exists()
    left = _staging(work)
    assert len(left) == 1 and (left[0] / ".run" / "manifest.json").exists()

    res = convert(work, out, "--resume")
    assert res.returncode == 0, res.stderr
    done = {"layer:0": 0, "layer:2": 2, "shard:last": LAYERS}[kill_at]
    assert "resume: continuing .quantkit-tmp-" in res.stderr and f"after {done} of {LAYERS} layers" in res.stderr
    assert "warning" not in res.stderr
    assert _files(work / out) == reference   # every file, quantization_log.json included
    assert not _staging(work)


def test_a_changed_calibration_set_or_recipe_starts_afresh_with_one_line(work, reference):
    text = (work / "calib.txt").read_text(encoding="utf-8")
    (work / "calib-m.txt").write_text(text, encoding="utf-8")
    assert convert(work, "out-mismatch", kill_at="layer:2", calib="calib-m.txt").returncode == -signal.SIGKILL

    # the same file name, other text: the recipe is the same, its token ids are not
    (work / "calib-m.txt").write_text(text[len(text) // 2:], encoding="utf-8")
    res = convert(work, "out-mismatch", "--resume", kill_at="layer:2", calib="calib-m.txt")
    assert res.returncode == -signal.SIGKILL   # killed again, so there is a run to mismatch next
    lines = [line for line in res.stderr.splitlines() if "resume:" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: resume: starting afresh: the calibration set differs"), \
        res.stderr
    assert len(_staging(work)) == 1   # the old folder went; the new run's is there

    res = convert(work, "out-mismatch", "--resume", "--group-size", "16", calib="calib-m.txt")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "resume:" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: resume: starting afresh: the recipe differs"), res.stderr
    log = json.loads((work / "out-mismatch" / "quantization_log.json").read_text())
    assert any(w.startswith("resume: starting afresh: the recipe differs") for w in log["warnings"])
    assert not _staging(work)


def test_sigterm_cleans_up_or_keeps_a_resumable_folder(work):
    # before any layer is done there is nothing worth keeping
    res = convert(work, "out-term", kill_at="layer:0", signal_name="TERM")
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert "Traceback" not in res.stderr
    assert not (work / "out-term").exists() and not _staging(work)

    # after two layers the staging folder stays, and stderr says how to continue
    res = convert(work, "out-term", kill_at="layer:2", signal_name="TERM", recipe="offload.yaml")
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "interrupted (SIGTERM) after 2 of 4 layers" in last and "--resume" in last
    assert not (work / "out-term").exists()
    (kept,) = _staging(work)
    assert (kept / ".run" / "activations").is_dir()   # offloaded hidden states: the snapshot

    res = convert(work, "out-term", "--resume", recipe="offload.yaml")
    assert res.returncode == 0, res.stderr
    assert "after 2 of 4 layers" in res.stderr
    assert not _staging(work)
    assert convert(work, "ref-offload", recipe="offload.yaml").returncode == 0
    assert _files(work / "out-term") == _files(work / "ref-offload")
