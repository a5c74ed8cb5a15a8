"""What the user gave quantkit is never removed or changed, whatever the flags: output paths that
are, contain or lie inside an input, folders quantkit did not write, a hostile model folder, and
mistakes that must be one line. Each case runs in a real process (``hostile.py``): exit 2, one
``error:`` line naming the culprit, no traceback, nothing new in the case's folder, the working
directory or the temporary folder, and every input's bytes unchanged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from hostile import assert_refused, digests, entries, quantkit_env, run_quantkit
from model_factory import make_llama_dir, save_byte_tokenizer


@dataclass(frozen=True)
class Inputs:
    """A world of the user's own files, copied fresh for every case."""

    root: Path
    model: Path        # a tiny Llama with a byte-level tokenizer
    quantized: Path    # that model converted with w8a16 (a quantkit output)
    log: Path          # a JSONL traffic log
    calib: Path        # a quantkit calibrate output drawn from ``log``
    mine: Path         # a folder of the user's own files

    def all(self) -> list[Path]:
        return [self.model, self.quantized, self.log, self.calib, self.mine]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Inputs:
    import quantkit
    from quantkit.calibration.calibration_set import calibrate

    root = tmp_path_factory.mktemp("hostile-template")
    model = save_byte_tokenizer(make_llama_dir(root / "model", vocab=260))
    quantkit.quantize(str(model), "w8a16").save(root / "quantized")
    log = root / "traffic.jsonl"
    log.write_text("".join(json.dumps({"text": f"Order {i}: {i * 7} parcels left the depot at {i % 24}:00."}) + "\n"
                           for i in range(60)))
    calibrate(log, str(model), num_samples=8, max_len=64, out=root / "calib")
    mine = root / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own notes")
    return Inputs(root, model, root / "quantized", log, root / "calib", mine)


@pytest.fixture
def world(template, tmp_path) -> tuple[Inputs, Path, Path]:
    """A fresh copy of the inputs, a working directory and a TMPDIR of the case's own."""
    root = tmp_path / "user"
    shutil.copytree(template.root, root, symlinks=True)
    w = Inputs(root, *(root / p.relative_to(template.root) for p in
                       (template.model, template.quantized, template.log, template.calib, template.mine)))
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    return w, cwd, tmp


Case = Callable[[Inputs], tuple[list, tuple[str, ...]]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__.replace("_", "-")] = fn
    return fn


def _eval(w: Inputs, out: Path, *extra) -> list:
    return ["eval", "--baseline", w.model, "--candidate", w.quantized, "--suite", "numbers-en", "--out", out, *extra]


def _convert(w: Inputs, out: Path, *extra, model: Path | None = None) -> list:
    return ["convert", model or w.model, "--recipe", "w8a16", "--out", out, "--no-eval", *extra]


# -- data loss: an output path onto the user's folders -----------------------------------------
@case
def eval_out_is_the_baseline(w):
    return _eval(w, w.model, "--overwrite"), ("--out", str(w.model), "is the baseline model")


@case
def eval_out_is_the_candidate(w):
    return _eval(w, w.quantized, "--overwrite"), ("--out", str(w.quantized), "is the candidate checkpoint")


@case
def eval_out_is_a_folder_of_the_users_files(w):
    return _eval(w, w.mine), ("--out", str(w.mine), "output folder exists")


@case
def eval_out_is_a_folder_of_the_users_files_with_overwrite(w):
    return _eval(w, w.mine, "--overwrite"), (str(w.mine), "is not a quantkit output")


@case
def eval_out_is_the_working_directory(w):
    return _eval(w, Path("."), "--overwrite"), ("--out", "is the working directory")


@case
def convert_overwrite_onto_the_source_model(w):
    return _convert(w, w.model, "--overwrite"), ("--out", "is the model folder")


@case
def convert_overwrite_onto_a_parent_of_the_source(w):
    return _convert(w, w.root, "--overwrite"), ("--out", f"contains the model folder {w.model}")


@case
def convert_overwrite_onto_a_folder_quantkit_did_not_write(w):
    return _convert(w, w.mine, "--overwrite"), (str(w.mine), "is not a quantkit output")


@case
def convert_overwrite_onto_a_calibration_output(w):
    return _convert(w, w.calib, "--overwrite"), (str(w.calib), "output of 'quantkit calibrate'")


@case
def calibrate_out_exists(w):
    return ["calibrate", w.log, "--model", w.model, "--n", "8", "--max-len", "64", "--out", w.calib], \
        ("--out", str(w.calib), "output folder exists")


@case
def calibrate_overwrite_onto_its_own_input(w):
    log = w.calib / "samples.jsonl"
    return ["calibrate", log, "--model", w.model, "--n", "4", "--max-len", "64", "--out", w.calib, "--overwrite"], \
        ("--out", f"contains the traffic log {log}")


@case
def sensitivity_out_onto_the_calibration_log(w):
    return ["sensitivity", w.model, "--calib", w.log, "--out", w.log, "--overwrite"], \
        ("--out", "is the calibration data")


# -- a hostile model folder --------------------------------------------------------------------
@case
def model_file_linked_outside_the_folder(w):
    secret = w.root / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (w.model / "chat_template.jinja").symlink_to(secret)
    return _convert(w, w.root / "out"), (str(w.model / "chat_template.jinja"), "outside the model folder")


@case
def eval_candidate_with_a_link_outside(w):
    (w.quantized / "tokenizer_config.json").unlink()
    (w.quantized / "tokenizer_config.json").symlink_to("/etc/hostname")
    return _eval(w, w.root / "report"), (str(w.quantized / "tokenizer_config.json"), "outside the model folder")


# -- mistakes that must be one line ------------------------------------------------------------
@case
def unknown_flag(w):
    return _convert(w, w.root / "out", "--quantise-harder"), ("No such option: --quantise-harder",)


@case
def ignore_that_keeps_everything(w):
    return _convert(w, w.root / "out", "--ignore", "re:.*"), ("--ignore 're:.*'", "nothing would be quantized")


@case
def budget_above_every_plan(w):
    return ["convert", w.model, "--recipe", "w4a16-g64", "--budget", "100", "--calib", w.log, "--no-eval",
            "--out", w.root / "out"], ("budget: 100.0 bits per weight is above the largest plan",)


@case
def plan_utilization_above_one(w):
    return ["plan", w.model, "--utilization", "2"], ("--utilization: 2.0 is not in (0, 1]",)


@case
def calibrate_max_len_beyond_any_model(w):
    return ["calibrate", w.log, "--model", w.model, "--max-len", "99999999999", "--out", w.root / "c"], \
        ("max_len (--max-len)", "99999999999")


@case
def calibrate_max_len_beyond_the_model(w):
    return ["calibrate", w.log, "--model", w.model, "--max-len", "8192", "--out", w.root / "c"], \
        ("--max-len: 8192 tokens is above the model's max_position_embeddings 4096",)


@case
def calibrate_samples_beyond_any_need(w):
    return ["calibrate", w.log, "--model", w.model, "--n", "999999999", "--out", w.root / "c"], \
        ("num_samples (--n)", "999999999")


@case
def sensitivity_tokens_beyond_any_need(w):
    return ["sensitivity", w.model, "--calib", w.log, "--tokens", "99999999"], ("--tokens", "65536")


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_in_a_real_process_and_nothing_changes(name, world):
    w, cwd, tmp = world
    args, names = CASES[name](w)
    before, seen = digests(*w.all()), entries(w.root, cwd, tmp)
    res = run_quantkit(args, cwd=cwd, env=quantkit_env(TMPDIR=str(tmp)), timeout=240)
    assert_refused(res, *names)
    assert entries(w.root, cwd, tmp) == seen
    assert digests(*w.all()) == before


def test_the_slot_of_a_checkpoint_is_written_and_replaced_only_with_overwrite(world):
    """``quantkit eval`` without ``--out`` writes CHECKPOINT/eval, the report slot of a checkpoint
    quantkit wrote, and changes no other file of it; a second run needs ``--overwrite``."""
    w, cwd, tmp = world
    args = ["eval", "--baseline", w.model, "--candidate", w.quantized, "--suite", "numbers-en"]
    before = digests(w.quantized)
    res = run_quantkit(args, cwd=cwd, env=quantkit_env(TMPDIR=str(tmp)))
    assert res.returncode == 0, res.stderr[-2000:]
    after = digests(w.quantized)
    assert {k: v for k, v in after.items() if not k.startswith(str(w.quantized / "eval"))} == before
    assert json.loads((w.quantized / "eval" / ".quantkit-output.json").read_text())["command"] == "eval"
    report = digests(w.quantized / "eval")
    assert_refused(run_quantkit(args, cwd=cwd), "output folder exists")
    assert digests(w.quantized / "eval") == report
    assert run_quantkit([*args, "--overwrite"], cwd=cwd).returncode == 0


def test_eval_writes_nothing_into_a_model_folder_it_did_not_make(world):
    w, cwd, tmp = world
    before, seen = digests(*w.all()), entries(w.root, cwd, tmp)
    res = run_quantkit(["eval", "--baseline", w.model, "--candidate", w.model, "--suite", "numbers-en"], cwd=cwd,
                       env=quantkit_env(TMPDIR=str(tmp)))
    assert_refused(res, "--out: needed", str(w.model))
    assert entries(w.root, cwd, tmp) == seen and digests(*w.all()) == before


def test_side_files_are_the_known_ones_only(world):
    """Files of the model folder beyond the tokenizer, template, generation config and card never
    reach the checkpoint; a link that stays inside the folder is followed."""
    w, cwd, tmp = world
    (w.model / "api_key.txt").write_text("sk-secret")
    (w.model / "tokenizer_notes.txt").write_text("private")
    (w.model / "templates").mkdir()
    (w.model / "templates" / "chat.jinja").write_text("{{ messages }}")
    (w.model / "chat_template.jinja").symlink_to("templates/chat.jinja")
    res = run_quantkit(_convert(w, w.root / "out"), cwd=cwd, env=quantkit_env(TMPDIR=str(tmp)))
    assert res.returncode == 0, res.stderr[-2000:]
    out = w.root / "out"
    assert not (out / "api_key.txt").exists() and not (out / "tokenizer_notes.txt").exists()
    assert (out / "chat_template.jinja").read_text() == "{{ messages }}"
    assert not (out / "chat_template.jinja").is_symlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_full_disk_is_one_line_naming_the_folder_and_bytes(world, tmp_path):
    w, cwd, tmp = world
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(small)], check=True)
    try:
        before = digests(*w.all())
        res = run_quantkit(_convert(w, small / "out"), cwd=cwd, env=quantkit_env(TMPDIR=str(tmp)))
        line = assert_refused(res, str(small), "no space left on the device", "bytes to write", "bytes free")
        assert "SafetensorError" not in line
        assert list(small.iterdir()) == []       # the staging folder is gone
        assert digests(*w.all()) == before
    finally:
        subprocess.run(["umount", str(small)], check=True)
