"""The integrity pass inside `quantkit eval`: a damaged module puts the verdict at NO-GO whatever the
slices say, is named on the console and in report.json / .md / .html (heat map included); a
checkpoint that cannot be served is judged on its files alone; bad files are one line, exit 2."""
import json
import shutil

import pytest
import typer
import yaml
from planted import plant, zero_block
from report_html import lookup, parse
from tiny import TINY_THRESHOLDS
from typer.testing import CliRunner

import quantkit
from model_factory import random_ids
from quantkit.cli.eval_command import eval_command

EVAL = {"suite": "numbers-en", "max_len": 256,
        "thresholds": {**TINY_THRESHOLDS, "focus_top1_agreement": {"review": 0.5, "nogo": 0.3}},
        "options": {"text_items": 2, "gen_prompts": 0, "extract_items": 0, "item_tokens": 48}}
HEAD = "model.layers.1.self_attn.q_proj"


@pytest.fixture(scope="module")
def folders(base, tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity-eval")
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    quantkit.quantize(str(root / "base"), "w8a16").save(root / "w8a16")
    awq = {"version": 1, "scheme": "W4A16", "group_size": 32, "steps": ["awq", "rtn"],
           "calibration": {"num_samples": 8, "max_seq_len": 32}}
    quantkit.quantize(str(root / "base"), awq, calibration=random_ids(8, 32, vocab=len(tok))).save(root / "awq")
    (root / "recipe.yaml").write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": EVAL}))
    return root


def run(folders, candidate, out):
    a = typer.Typer()
    a.command()(eval_command)
    return CliRunner().invoke(a, ["--baseline", str(folders / "base"), "--candidate", str(candidate),
                                  "--recipe", str(folders / "recipe.yaml"), "--out", str(out)])


def test_a_zeroed_head_of_scales_is_no_go_and_named_everywhere(folders, tmp_path):
    # the reviewer's case: one attention head's q_proj scales of a middle layer zeroed in W8A16
    bad = plant(folders / "w8a16", tmp_path / "bad", f"{HEAD}.weight_scale", zero_block)
    r = run(folders, bad, tmp_path / "report")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["decision"] == "NO-GO" and data["slices"]            # the slices were measured too
    assert f"integrity:{HEAD}" in {x["slice"] for x in data["verdict"]["reasons"]}
    flagged = data["integrity"]["flagged"]
    assert [f["name"] for f in flagged] == [HEAD] and flagged[0]["level"] == "NO-GO"
    assert "weight_scale: 16 of 64 values zero or negative" in flagged[0]["problems"]
    assert f"NO-GO {HEAD}: weight_scale: 16 of 64 values zero or negative" in r.stdout
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Checkpoint integrity" in md and f"| {HEAD} | NO-GO |" in md
    html = (tmp_path / "report" / "report.html").read_text()
    p = parse(html)
    assert any(img.get("alt") == "integrity heat map" for img in p.images)
    cells = {k: v for k, v in p.cells.items() if k.startswith("integrity.")}
    assert cells and all(float(v) == lookup(data, k) for k, v in cells.items())


def test_the_untouched_checkpoint_is_go_with_the_pass_timed(folders, tmp_path):
    r = run(folders, folders / "awq", tmp_path / "report")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["integrity"]["flagged"] == [] and not any(s.startswith("integrity:") for s in data["verdict"]["slices"])
    assert len(data["integrity"]["transformed"]) == 2 and data["meta"]["integrity_seconds"] < 10
    assert "integrity: 14 quantized modules checked against the baseline" in r.stdout


def test_a_checkpoint_that_cannot_be_served_is_judged_on_its_files(folders, tmp_path):
    bad = plant(folders / "w8a16", tmp_path / "bad", f"{HEAD}.weight_packed", lambda t: None)
    r = run(folders, bad, tmp_path / "report")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["decision"] == "NO-GO" and data["slices"] == {} and "slices_skipped" in data["meta"]
    assert data["integrity"]["flagged"][0]["problems"] == ["weight_packed missing"]
    assert "no slice was measured" in (tmp_path / "report" / "report.md").read_text()


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage, message", [
    (lambda d: _truncate(d / "transforms" / "layer-00000.safetensors"),
     "transforms/layer-00000.safetensors: not a valid safetensors file"),
    (lambda d: _truncate(d / "model.safetensors"), "model.safetensors: not a valid safetensors file"),
    (lambda d: (d / "quantization_log.json").write_text("{not json"), "quantization_log.json: not JSON"),
])
def test_a_bad_candidate_file_is_one_line_naming_it_exit_2(folders, tmp_path, damage, message):
    bad = tmp_path / "bad"
    shutil.copytree(folders / "awq", bad)
    damage(bad)
    r = run(folders, bad, tmp_path / "report")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0], r.stderr
