"""Code items in an evaluation: run behind the sandbox (escapes contained, the item fails,
the evaluation ends in time), skipped and recorded where there is no sandbox, run without
one only when asked; a pickled baseline is refused before anything loads."""
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import quantkit
from quantkit.evaluation import sandbox, task_metrics as tasks
from quantkit.evaluation.evaluator import evaluate
from quantkit.evaluation.slices import Slice, SuiteOptions

from test_eval_cli import app

REPO_FILE = Path(quantkit.__file__)
PROMPT = "def f():\n    return 1\n"
CHECK = "\ndef check(g):\n    assert g() == 1\n"
OPTIONS = SuiteOptions(code_timeout_s=2.0, code_tokens=4, text_items=2, gen_prompts=0, item_tokens=64)


def code_item(name: str, attack: str) -> dict:
    return {"id": name, "kind": "code", "prompt": PROMPT, "test": attack + CHECK, "entry_point": "f"}


@pytest.fixture
def empty_completions(monkeypatch):
    # a model that ends every completion at once: the program is the item's own code, so each
    # attack runs whatever a random tiny model would have generated
    monkeypatch.setattr(tasks, "greedy", lambda model, prompts, *a, **kw: [[] for _ in prompts])


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "quantkit-no-such-bwrap")


@pytest.fixture
def outside():
    d = Path(tempfile.mkdtemp(prefix="quantkit-outside-", dir="/var/tmp"))
    d.chmod(0o777)   # writable by anyone: only the sandbox's mounts keep the program out
    yield d
    shutil.rmtree(d)


def test_escaping_code_items_are_contained_and_fail(base, tok, outside, empty_completions):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.3)
    port = srv.getsockname()[1]
    before = REPO_FILE.read_bytes()
    items = [
        code_item("posix", f"import posix\nassert posix.system('echo x > {outside}/posix') == 0\n"),
        code_item("subprocess", f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {outside}/sp'], check=True)\n"),
        code_item("open", f"open('{outside}/open', 'w').write('x')\nopen({str(REPO_FILE)!r}, 'a').write('x')\n"),
        code_item("fork", "import os\nwhile True:\n    os.fork()\n"),
        code_item("socket", f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"),
        code_item("memory", "x = bytearray(8 * 2**30)\n"),
        code_item("loop", "while True:\n    pass\n"),
        code_item("control", ""),      # proves the items ran: this one passes
    ]
    t = time.perf_counter()
    try:
        result = evaluate(base, base, tok, suite=[Slice("escape-en", items)], options=OPTIONS, progress=False)
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()
    seconds = time.perf_counter() - t
    # two models: the endless loop's 2 s twice, everything else well under a second each
    assert seconds < 12, seconds
    values = result.slices["escape-en"]
    assert values["code_problems"] == 8
    assert values["code_pass_base"] == values["code_pass_cand"] == 1 / 8
    assert os.listdir(outside) == [] and REPO_FILE.read_bytes() == before
    assert result.meta["code_exec"] == {"runner": "bubblewrap sandbox"} and result.warnings == []


def test_without_a_sandbox_code_items_are_skipped_and_the_report_says_so(base, tok, no_bwrap, empty_completions,
                                                                         tmp_path):
    only_code = [Slice("escape-en", [code_item("control", "")])]
    result = evaluate(base, base, tok, suite=only_code, options=OPTIONS, progress=False)
    assert result.slices["escape-en"] == {}
    assert result.decision == "REVIEW"          # nothing measured: never GO
    skip, nothing = result.warnings
    assert skip.startswith("code items skipped, not measured: escape-en (1)") and "bwrap" in skip
    assert "--unsafe-code-exec" in skip and "nothing was measured" in nothing
    assert result.meta["code_exec"]["runner"] is None
    out = result.save(tmp_path / "report")
    data = json.loads((out / "report.json").read_text())
    assert data["warnings"] == result.warnings and data["decision"] == "REVIEW"
    assert skip in (out / "report.md").read_text() and "id='warnings'" in (out / "report.html").read_text()

    text = Slice("code-en", [{"id": "t", "kind": "text", "text": "def add(a, b):\n    return a + b\n" * 8}])
    mixed = evaluate(base, base, tok, suite=[text, *only_code], options=OPTIONS, progress=False)
    assert mixed.decision == "GO" and len(mixed.warnings) == 1 and mixed.warnings[0] == skip
    assert "kl_mean" in mixed.slices["code-en"]


def test_the_unsafe_option_runs_code_without_the_sandbox(base, tok, no_bwrap, empty_completions):
    result = evaluate(base, base, tok, suite=[Slice("escape-en", [code_item("control", "")])], options=OPTIONS,
                      progress=False, unsafe_code_exec=True)
    assert result.slices["escape-en"]["code_pass_base"] == 1.0
    assert result.meta["code_exec"] == {"runner": "unsandboxed (unsafe_code_exec)"}
    assert "WITHOUT a sandbox" in result.warnings[0]


@pytest.fixture(scope="module")
def folders(base, tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("code-items")
    base.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "suite").mkdir()
    (root / "suite" / "mine-en.jsonl").write_text(json.dumps(code_item("control", "")) + "\n")
    return root


def _eval(folders, out, *extra):
    return CliRunner().invoke(app(), ["--baseline", str(folders / "model"), "--candidate", str(folders / "model"),
                                      "--suite", str(folders / "suite"), "--out", str(out), *extra])


def test_cli_skips_code_without_a_sandbox_and_runs_it_with_the_unsafe_flag(folders, tmp_path, no_bwrap,
                                                                          empty_completions):
    r = _eval(folders, tmp_path / "skipped")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("REVIEW") and "warning: code items skipped, not measured: mine-en (1)" in r.stdout
    assert json.loads((tmp_path / "skipped" / "report.json").read_text())["slices"]["mine-en"] == {}
    r = _eval(folders, tmp_path / "unsafe", "--unsafe-code-exec")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "unsafe" / "report.json").read_text())
    assert data["slices"]["mine-en"]["code_pass_base"] == 1.0 and "WITHOUT a sandbox" in data["warnings"][0]
    assert "warning: --unsafe-code-exec" in r.stdout


class _Marker:
    """Unpickling this creates a file: the proof that a pickle was (not) loaded."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_baseline_is_refused_in_one_line(folders, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folders / "model" / name, pickled / name)
    marker = tmp_path / "unpickled"
    with open(pickled / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": _Marker(str(marker))}, f)
    out = tmp_path / "report"
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", "eval", "--baseline", str(pickled),
                          "--candidate", str(folders / "model"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: {pickled / 'pytorch_model.bin'}: pickle checkpoints are not loaded (unsafe); "
        "convert the model to safetensors"]
    assert not marker.exists() and not out.exists()
