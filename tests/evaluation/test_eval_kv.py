"""``quantkit eval --kv``: a bad option is one line before anything loads; with options, every
measure sees the first one's KV error, the report says where each option's scales came from,
and the footprint gives each option's bytes per token."""
import json

import test_eval_cli
import typer
from typer.testing import CliRunner

from quantkit.cli.eval_command import eval_command

folders = test_eval_cli.folders  # the fixture: tiny base, W8A16 checkpoint, recipe


def _run(folders, out, *extra):
    a = typer.Typer()
    a.command()(eval_command)
    return CliRunner().invoke(a, ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16"),
                                  "--recipe", str(folders / "recipe.yaml"), "--out", str(out), *extra])


def test_a_bad_kv_option_is_one_line_and_nothing_is_written(folders):
    out = folders / "bad"
    r = _run(folders, out, "--kv", "fp8-tensor,int3-kivi")
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --kv: unknown KV option 'int3-kivi'"), r.output
    assert not out.exists()


def test_kv_options_reach_every_measure_and_the_report(folders):
    plain = _run(folders, folders / "plain")
    assert plain.exit_code == 0, plain.output
    r = _run(folders, folders / "kv", "--kv", "fp8-tensor:k", "--kv", "int8-kivi")
    assert r.exit_code == 0, r.output
    a = json.loads((folders / "plain" / "report.json").read_text())
    b = json.loads((folders / "kv" / "report.json").read_text())
    assert "kv" not in a["meta"] and "kv_options" not in a["footprint"]
    kv = b["meta"]["kv"]
    assert [k["option"] for k in kv] == ["fp8-tensor:k", "int8-kivi"]
    assert kv[0]["scales"].startswith("calibrated") and kv[1]["scales"].startswith("dynamic")
    fp = b["footprint"]["kv_options"]
    assert set(fp) == {"fp8-tensor:k", "int8-kivi"} and fp["int8-kivi"]["residual_bytes_per_request"] > 0
    assert fp["fp8-tensor:k"]["bytes_per_token"] == a["footprint"]["kv_bytes_per_token"] * 3 / 4   # K fp8, V fp16
    assert b["footprint"]["kv_bytes_per_token"] == fp["fp8-tensor:k"]["bytes_per_token"]   # the first deploys
    for name in a["slices"]:   # the first option's K error reaches every slice's KL
        assert b["slices"][name]["kl_mean"] != a["slices"][name]["kl_mean"], name
