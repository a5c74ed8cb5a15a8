"""A property of every command that writes: whatever output path is given relative to its inputs
(the input itself, a parent, a child, a sibling, through a symbolic link, the working directory or
its parent) and with or without ``--overwrite``, no input byte ever changes. Paths that overlap an
input are refused (exit 2); a sibling is written.

The commands run in-process (typer's runner) so that many generated cases fit in a few minutes;
``test_hostile_outputs.py`` runs the same refusals in real processes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hostile import digests
from model_factory import make_llama_dir, save_byte_tokenizer

RELATIONS = ("equal", "parent", "child", "grandchild", "sibling", "link-to", "aliased-parent",
             "child-through-link", "cwd", "cwd-parent")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    import quantkit
    from quantkit.calibration.calibration_set import calibrate

    root = tmp_path_factory.mktemp("property-template")
    model = save_byte_tokenizer(make_llama_dir(root / "model", vocab=260))
    quantkit.quantize(str(model), "w8a16").save(root / "quantized")
    (root / "traffic.jsonl").write_text("".join(
        json.dumps({"text": f"Ticket {i}: refund {i * 3} euros for order {i * 11}."}) + "\n" for i in range(40)))
    calibrate(root / "traffic.jsonl", str(model), num_samples=4, max_len=64, out=root / "calib")
    (root / "recipe.yaml").write_text("scheme: W8A16\n")
    return root


# command -> (its inputs, by name in the template; the argv for an output path)
COMMANDS = {
    "convert": (("model", "recipe.yaml", "traffic.jsonl"),
                lambda ws, out: ["convert", ws / "model", "--recipe", ws / "recipe.yaml", "--calib",
                                 ws / "traffic.jsonl", "--out", out, "--no-eval"]),
    "eval": (("model", "quantized"),
             lambda ws, out: ["eval", "--baseline", ws / "model", "--candidate", ws / "quantized", "--suite",
                              "numbers-en", "--out", out]),
    "calibrate": (("calib/samples.jsonl", "model"),
                  lambda ws, out: ["calibrate", ws / "calib" / "samples.jsonl", "--model", ws / "model", "--n", "4",
                                   "--max-len", "64", "--out", out]),
    "sensitivity": (("model", "traffic.jsonl"),
                    lambda ws, out: ["sensitivity", ws / "model", "--recipe", "w8a16", "--calib",
                                     ws / "traffic.jsonl", "--tokens", "64", "--out", out]),
}


def place(ws: Path, target: Path, relation: str) -> tuple[Path, Path]:
    """``(output path, working directory)`` for ``relation`` to the input ``target``."""
    home = ws.parent / "cwd"
    if relation == "equal":
        return target, home
    if relation == "parent":
        return target.parent, home
    if relation == "child":
        return target / "out", home
    if relation == "grandchild":
        return target / "a" / "b", home
    if relation == "sibling":
        return target.parent / f"new-{target.name}-out", home
    if relation == "link-to":
        link = ws.parent / "link"
        link.symlink_to(target)
        return link, home
    if relation == "aliased-parent":
        alias = ws.parent / "alias"
        alias.symlink_to(target.parent, target_is_directory=True)
        return alias / target.name, home
    if relation == "child-through-link":
        alias = ws.parent / "alias"
        alias.symlink_to(target, target_is_directory=target.is_dir())
        return alias / "out", home
    if relation == "cwd":
        return Path("."), target if target.is_dir() else target.parent
    if relation == "cwd-parent":
        return Path(".."), target if target.is_dir() else target.parent
    raise AssertionError(relation)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(COMMANDS)), pick=st.integers(0, 2), relation=st.sampled_from(RELATIONS),
       overwrite=st.booleans())
def test_no_output_path_changes_an_input(template, command, pick, relation, overwrite):
    from quantkit.cli import app

    names, argv = COMMANDS[command]
    box = Path(tempfile.mkdtemp(prefix="out-property-"))
    try:
        ws = box / "user"
        shutil.copytree(template, ws, symlinks=True)
        (box / "cwd").mkdir()
        target = ws / names[pick % len(names)]
        out, cwd = place(ws, target, relation)
        inputs = [ws / n for n in names]
        before = digests(*inputs)
        here = os.getcwd()
        os.chdir(cwd)
        try:
            args = argv(ws, out) + (["--overwrite"] if overwrite else [])
            r = CliRunner().invoke(app, [str(a) for a in args])
        finally:
            os.chdir(here)
        assert digests(*inputs) == before, (command, relation, r.output)
        if relation == "sibling":
            assert r.exit_code == 0, (command, r.output, r.exception)
        else:
            assert r.exit_code == 2, (command, relation, r.output, r.exception)
            assert "Traceback" not in r.output
    finally:
        shutil.rmtree(box, ignore_errors=True)
