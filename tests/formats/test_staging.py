"""Staging folders of dead runs are found and removed; a live run's folder is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import quantkit
from quantkit.formats import staging
from quantkit.formats.staging import Owner


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_owner_liveness():
    me = Owner.current()
    assert me.alive()
    assert not replace(me, pid=dead_pid()).alive()
    assert not replace(me, proc_start=me.proc_start + 1).alive()        # the pid now belongs to another process
    assert not replace(me, boot_id="0" * 36).alive()                      # rebooted since
    assert replace(me, pid=dead_pid(), host="elsewhere").alive()          # another host: cannot tell, so alive
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.time() + 10
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.time() < deadline
            time.sleep(0.01)
        assert not Owner(zombie.pid, me.host).alive()
    finally:
        zombie.wait()


def test_the_name_tells_the_owner_when_the_record_is_gone(tmp_path):
    folder = staging.make_folder(tmp_path, out=tmp_path / "out")
    assert staging.owner_of(folder).out == str((tmp_path / "out").resolve())
    assert folder.stat().st_mode & 0o777 == 0o777 & ~_umask()   # not mkdtemp's 0700
    (folder / ".run" / "owner.json").unlink()
    assert staging.owner_of(folder) == Owner(os.getpid(), Owner.current().host)
    (tmp_path / ".quantkit-tmp-x1y2z3").mkdir()                   # made before owners were recorded
    assert staging.owner_of(tmp_path / ".quantkit-tmp-x1y2z3") is None
    assert staging.dead_folders(tmp_path) == []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fake_run(parent: Path, owner: Owner, manifest: bool) -> Path:
    folder = parent / f".quantkit-tmp-{owner.host}-{owner.pid}-{os.urandom(4).hex()}"
    folder.mkdir()
    staging.write_owner(folder, owner)
    (folder / "shard-00000.safetensors").write_bytes(b"x" * 64)
    if manifest:
        boundary = {"layers_done": 1, "num_layers": 2, "batch_tokens": None, "batches": 0,
                    "writer": {"shards": [], "parts": [], "next_part": 0, "total_bytes": 0},
                    "log": {"stats": {}, "transforms": {}, "groups": [], "formats": {}}, "state": "state-00001.safetensors"}
        (folder / ".run" / "manifest.json").write_text(json.dumps({"format": 1, "keys": {}, "boundary": boundary}))
    return folder


def test_a_run_removes_dead_runs_folders_and_leaves_live_ones(tiny_llama, tmp_path):
    out, other = tmp_path / "out", tmp_path / "other"
    me, gone = Owner.current(out), dead_pid()
    dead_mine = _fake_run(tmp_path, replace(me, pid=gone), manifest=True)
    dead_no_manifest = _fake_run(tmp_path, replace(me, pid=gone, out=str(other)), manifest=False)
    dead_anonymous = _fake_run(tmp_path, replace(me, pid=gone, out=None), manifest=True)
    kept = {
        "live, same output": _fake_run(tmp_path, me, manifest=True),
        "dead, another output's resumable run": _fake_run(tmp_path, replace(me, pid=gone, out=str(other)), manifest=True),
        "another host": _fake_run(tmp_path, replace(me, pid=gone, host="elsewhere"), manifest=True),
    }
    legacy = tmp_path / ".quantkit-tmp-k2j4h5"
    legacy.mkdir()

    lines: list[str] = []
    q = quantkit.quantize(tiny_llama, "w8a16", options=quantkit.ConvertOptions(out=out, log=lines.append))
    assert q.save() == out
    assert not dead_mine.exists() and not dead_no_manifest.exists() and not dead_anonymous.exists()
    assert all(f.exists() for f in kept.values()) and legacy.exists()
    assert any(f"removed {dead_mine.name}, an interrupted run of {out.resolve()} (1 of 2 layers done" in line
               for line in lines), lines
    assert not (out / ".run").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".quantkit-tmp-")) == \
        sorted([legacy.name, *(f.name for f in kept.values())])


def test_resume_needs_an_output_folder(tiny_llama):
    with pytest.raises(quantkit.QuantkitError, match="resume: needs out="):
        quantkit.quantize(tiny_llama, "w8a16", options=quantkit.ConvertOptions(resume=True))


def test_an_unsaved_result_leaves_no_folder_and_no_traceback_at_exit(tiny_llama, tmp_path):
    """A result never saved, still held when the interpreter exits: its staging folder goes, and
    the exit prints nothing (module globals are not promised to a ``__del__`` at shutdown)."""
    out = tmp_path / "out"
    script = ("import sys, quantkit\n"
              f"q = quantkit.quantize({str(tiny_llama)!r}, 'w8a16', options=quantkit.ConvertOptions(out={str(out)!r}))\n"
              "print(q.path)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    assert res.returncode == 0, res.stderr[-2000:]
    staged = Path(res.stdout.strip().splitlines()[-1])
    assert staged.name.startswith(".quantkit-tmp-") and not staged.exists()
    assert "Exception ignored" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not out.exists()
