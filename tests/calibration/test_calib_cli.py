"""The `quantkit calibrate` face: exit codes, one-line errors, and byte-identical outputs across
processes (different PYTHONHASHSEED: no set or dict order may leak into the files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner


def _run(args, env=None):
    code = "import sys; from quantkit.cli import main; sys.argv = ['quantkit'] + sys.argv[1:]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_two_processes_one_seed_identical_files(tmp_path, default_rows, tokenizer_dir):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in default_rows[:150]))
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"out{hash_seed}"
        res = _run(["calibrate", str(log), "--model", str(tokenizer_dir), "--n", "24", "--max-len", "256",
                    "--out", str(out), "--seed", "3"], {"PYTHONHASHSEED": hash_seed})
        assert res.returncode == 0, res.stderr
        assert "calibrate: 24 samples from 150 distinct rows" in res.stdout
        outs.append(out)
    for name in ("samples.jsonl", "manifest.json", "report.md", "report.html", "report.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_bad_input_is_one_line_and_exit_2(tmp_path, tokenizer_dir):
    from quantkit.cli.calibrate_command import calibrate_command
    import typer

    app = typer.Typer()
    app.command()(calibrate_command)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n" * 3 + '{"text": "fine"}\n')
    res = CliRunner().invoke(app, [str(bad), "--model", str(tokenizer_dir), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    lines = [l for l in res.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: 75.0% of 4 rows malformed")
    res = CliRunner().invoke(app, [str(bad), "--model", str(tokenizer_dir), "--out", str(tmp_path / "o"),
                                   "--policy", "random"])
    assert res.exit_code == 2 and "calibration.policy" in res.output
