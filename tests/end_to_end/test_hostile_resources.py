"""Inputs that ask for unbounded resources, run as a user runs quantkit (tests/hostile.py).

Each case is refused quickly, in bounded memory, with one ``error:`` line naming the culprit,
and leaves nothing behind: no new entry in its own folder, its working directory or its
TMPDIR, and its inputs' bytes unchanged.

Time bound: ``python -m quantkit.cli --help`` alone takes about 2.7 s on this 2-core machine
(``import quantkit`` imports torch: 1.3 s of it), so a refusal is held to ``REFUSE_SECONDS``:
the import plus well under two seconds of checking, while the unbounded runs these cases
stood for took 100 s and more. Memory bound: the import is about 350 MB resident; the
unbounded runs reached 6 to 21 GB.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostile import Outcome, assert_refused, digests, entries, kill_group, quantkit_env, run_quantkit
from model_factory import make_llama_dir, save_byte_tokenizer

REFUSE_SECONDS = 5.0
REFUSE_RSS = 1 << 30


@dataclass
class Case:
    root: Path      # the inputs
    cwd: Path
    tmpdir: Path
    model: Path     # shared by the cases: its bytes are checked too

    def run(self, args: list) -> Outcome:
        before = entries(self.root, self.cwd, self.tmpdir)
        sums = digests(self.root, self.model)
        res = run_quantkit(args, cwd=self.cwd, env=quantkit_env(TMPDIR=str(self.tmpdir)), timeout=120)
        assert entries(self.root, self.cwd, self.tmpdir) == before, "a refused command left files behind"
        assert digests(self.root, self.model) == sums, "a refused command changed its inputs"
        return res


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = make_llama_dir(tmp_path_factory.mktemp("hostile-model") / "llama", vocab=260)
    save_byte_tokenizer(folder)
    return folder


@pytest.fixture
def case(tmp_path, model) -> Case:
    root, cwd, tmpdir = tmp_path / "case", tmp_path / "cwd", tmp_path / "tmp"
    for d in (root, cwd, tmpdir):
        d.mkdir()
    return Case(root, cwd, tmpdir, model)


def _assert_bounded(res: Outcome) -> None:
    assert res.seconds < REFUSE_SECONDS, f"refused after {res.seconds:.1f} s"
    assert res.peak_rss_bytes < REFUSE_RSS, f"peak RSS {res.peak_rss_bytes / 2**20:.0f} MiB"


# -- YAML ----------------------------------------------------------------------------------------
def _alias_bomb() -> str:
    text = 'version: 1\nscheme: W4A16\nl0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for k in range(1, 9):   # 9^9 strings once expanded
        text += f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]\n"
    return text + "description: *l8\n"


@pytest.mark.parametrize("name,text,limit", [
    ("bomb.yaml", _alias_bomb(), "more than 100000 nodes once aliases are expanded"),
    ("deep.yaml", "scheme: W4A16\ndescription: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64 levels"),
    ("big.yaml", "scheme: W4A16\ndescription: '" + "x" * (2 << 20) + "'\n", "larger than 1048576 bytes"),
    ("recursive.yaml", "scheme: W4A16\ndescription: &a [*a]\n", "recursive structure"),
])
def test_a_recipe_over_a_yaml_limit_is_refused_fast(case, name, text, limit):
    recipe = case.root / name
    recipe.write_text(text)
    res = case.run(["convert", case.model, "--recipe", recipe, "--out", case.root / "out", "--no-eval"])
    line = assert_refused(res, str(recipe), limit)
    assert len(line) < 200, line
    _assert_bounded(res)


def test_a_long_value_is_quoted_by_a_short_prefix_only(case):
    recipe = case.root / "long.yaml"
    recipe.write_text("scheme: W4A16\nsteps: ['" + "x" * 500_000 + "']\n")
    res = case.run(["convert", case.model, "--recipe", recipe, "--out", case.root / "out"])
    line = assert_refused(res, str(recipe), "steps[0]: unknown step 'xxx")
    assert len(line) < 300, line
    _assert_bounded(res)


# -- --nproc -------------------------------------------------------------------------------------
def test_more_ranks_than_cpus_is_refused_before_any_starts(case):
    cpus = len(os.sched_getaffinity(0))
    res = case.run(["convert", case.model, "--out", case.root / "out", "--nproc", cpus + 1, "--no-eval"])
    line = assert_refused(res, "--nproc", f"{cpus + 1} ranks", f"{cpus} CPU")
    _assert_bounded(res)
    assert line.startswith("error: --nproc: ")


def _run_processes(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (the run's unique --out path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def ranked(tmp_path_factory) -> Path:
    """A tiny model, a recipe that calibrates (GPTQ) and text enough for two batches."""
    import pydoc_data.topics

    root = tmp_path_factory.mktemp("ranked")
    make_llama_dir(root / "model", num_layers=4, vocab=260)
    save_byte_tokenizer(root / "model")
    (root / "calib.txt").write_text("\n\n".join(list(pydoc_data.topics.topics.values())[:80]), encoding="utf-8")
    (root / "recipe.yaml").write_text("scheme: W4A16\ngroup_size: 32\nsteps: [gptq]\n"
                                      "calibration: {num_samples: 64, max_seq_len: 128}\n")
    return root


@pytest.mark.parametrize("sig,when", [
    (signal.SIGTERM, "start"), (signal.SIGTERM, "layer:1"), (signal.SIGTERM, "shard:last"),
    (signal.SIGKILL, "start"), (signal.SIGKILL, "layer:1"),
])
def test_a_stopped_multi_rank_convert_leaves_no_process_and_no_staging(ranked, tmp_path, sig, when):
    (tmp_path / "work").mkdir()
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "work" / "out-unique"
    env = quantkit_env(TMPDIR=str(tmp_path / "tmp"))
    if when != "start":   # the ranks stop themselves there (SIGSTOP), so the kill lands at that point
        env.update(QUANTKIT_TEST_KILL_AT=when, QUANTKIT_TEST_KILL_SIGNAL="STOP")
    proc = subprocess.Popen([sys.executable, "-m", "quantkit.cli", "convert", "model", "--recipe", "recipe.yaml",
                             "--calib", "calib.txt", "--out", out, "--no-eval", "--nproc", "2"], cwd=ranked, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pids = _run_processes(str(out))
            ranks = [p for p in pids if p != proc.pid and b"torch.distributed.run" not in
                     Path(f"/proc/{p}/cmdline").read_bytes()] if pids else []
            if when == "start" and ranks:
                break
            if when != "start" and any(_stopped(p) for p in ranks):
                break
            assert proc.poll() is None, "the run ended before the point was reached"
            time.sleep(0.05)
        else:
            raise AssertionError(f"{when} not reached")
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 45   # torchrun's agent, told by the kernel, stops its ranks
        while _run_processes(str(out)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _run_processes(str(out)) == [], "a process of the run outlived it"
        if sig == signal.SIGTERM:   # a parent that can clean up leaves nothing beside --out, nor in TMPDIR
            assert entries(tmp_path / "work", tmp_path / "tmp") == {str(tmp_path / "work"), str(tmp_path / "tmp")}
    finally:
        kill_group(proc.pid)
        for p in _run_processes(str(out)):
            os.kill(p, signal.SIGKILL)


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


# -- calibration rows ----------------------------------------------------------------------------
def test_a_50_mb_calibration_row_is_skipped_unread_and_the_log_refused(case):
    log = case.root / "big.jsonl"
    with open(log, "w") as fh:   # one row of 50 MB: over the 4 MiB line limit for max_len 2048
        fh.write('{"text": "' + "a" * 50_000_000 + '"}\n')
    res = case.run(["calibrate", log, "--model", case.model, "--out", case.root / "calib"])
    assert_refused(res, str(log), "line_too_long 1 (first lines 1)")
    _assert_bounded(res)


def test_long_rows_are_cut_while_read_and_still_counted_truncated(tmp_path):
    import json

    from quantkit.calibration.calibration_set import calibrate
    from quantkit.calibration.io import read_log, row_byte_limit

    log = tmp_path / "long.jsonl"
    rows = [{"text": f"row {i} " + "x" * 5000} for i in range(4)] + [{"text": "y" * (5 << 20)}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = read_log(log, row_byte_limit(64))
    assert [n for n, _ in raw.records] == [1, 2, 3, 4] and raw.malformed.counts == {"line_too_long": 1}
    model = make_llama_dir(tmp_path / "m", vocab=260)
    save_byte_tokenizer(model)
    res = calibrate(log, str(model), num_samples=4, max_len=64, max_malformed_share=0.5)
    assert res.manifest["counts"]["truncated_selected"] == 4
    assert all(len(s["text"]) == 64 * 16 and len(s["input_ids"]) == 64 for s in res.samples)


# -- calibration sizes ---------------------------------------------------------------------------
# The model's limits come from its config, which transformers reads: these refusals pay for its
# import (about 5 to 8 s on this loaded 2-core machine, measured), not for any calibration work
CONFIG_REFUSE_SECONDS = 20.0


@pytest.mark.parametrize("flags,names", [
    (["--max-seq-len", "99999999999"], ["calibration.max_seq_len", "--max-seq-len", "99999999999",
                                        "max_position_embeddings"]),
    (["--num-samples", "999999999", "--max-seq-len", "128"], ["calibration.num_samples", "999999999 x 128",
                                                               "bytes available"]),
])
def test_calibration_sizes_past_the_model_or_the_memory_are_refused_up_front(case, flags, names):
    res = case.run(["convert", case.model, "--recipe", "w4a16-gptq", "--group-size", "32", *flags,
                    "--out", case.root / "out", "--no-eval"])
    assert_refused(res, *names)
    assert res.seconds < CONFIG_REFUSE_SECONDS and res.peak_rss_bytes < REFUSE_RSS, res
