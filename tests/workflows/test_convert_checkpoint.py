"""The Python API runs what ``quantkit convert`` runs: the conversion, its evaluation and model
card, and ``--budget go``'s search, whose verdicts are values (no report read back from disk)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from quantkit.api import ConvertRequest, Reporters, convert_checkpoint
from quantkit.sensitivity.planner import Plan
from quantkit.workflows import evaluate
from quantkit.workflows.convert_checkpoint import command_args
from quantkit.workflows.smallest_go import RESULT_FILE

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation"))
from tiny import TINY_THRESHOLDS, tiny_model, tiny_tokenizer  # noqa: E402

EVAL = {"suite": "numbers-en", "max_len": 256, "thresholds": TINY_THRESHOLDS,
        "options": {"text_items": 2, "extract_items": 2, "gen_prompts": 2, "gen_tokens": 4, "extract_tokens": 4,
                    "item_tokens": 64}}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("api")
    tok = tiny_tokenizer()
    tiny_model(len(tok)).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    (root / "recipe.yaml").write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": EVAL}))
    return root / "base"


def test_convert_evaluate_and_card_through_the_api_alone(base_dir, tmp_path):
    torch.set_num_threads(1)
    lines: list[str] = []
    done = convert_checkpoint(ConvertRequest(str(base_dir), str(base_dir.parent / "recipe.yaml"), tmp_path / "out"),
                              Reporters(None, lines.append))
    assert done.path == tmp_path / "out" and done.summary["quantized_modules"] > 0
    assert done.evaluation.folder == done.path / "eval"
    report = json.loads((done.path / "eval" / "report.json").read_text())
    assert done.decision in ("GO", "REVIEW", "NO-GO") and done.decision == report["decision"]
    assert f"**{done.decision}**" in (done.path / "README.md").read_text()   # the card carries the verdict
    assert done.launched_exit is None and done.search is None


def test_budget_go_through_the_api_takes_each_verdict_as_a_value(text_model, tmp_path, monkeypatch):
    verdicts: dict[float, str] = {}

    def verdict_only(model, folder, recipe, calib=None, lang="en", say=print):
        # no report is written: a search that read its verdicts back from disk would fail here
        bits = round(Plan.load(folder / "plan.json").bits_per_weight, 4)   # as a trial records it
        verdicts[bits] = "GO" if bits >= 7.0 else "NO-GO"
        return evaluate.Evaluated(_Result(verdicts[bits]), folder / "eval")

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", verdict_only)
    model, calib = text_model
    done = convert_checkpoint(ConvertRequest(model, "w4a16-g64", tmp_path / "out", str(calib), group_size=32,
                                             num_samples=8, max_seq_len=48, budget="go"), Reporters(None, lambda _: None))
    assert done.search.found is not None and done.search.found.bits_per_weight >= 7.0
    assert done.decision == "GO" and done.evaluation.folder == done.path / "eval"
    assert [t.decision for t in done.search.trials] == [verdicts[t.bits_per_weight] for t in done.search.trials]
    assert any(t.decision == "NO-GO" for t in done.search.trials)   # the search did bisect
    assert not (done.path / "eval" / "report.json").exists()
    assert json.loads((done.path / RESULT_FILE).read_text())["found"]["nbytes"] == done.search.found.nbytes


def test_a_request_renders_as_the_command_each_torchrun_rank_runs():
    request = ConvertRequest("m", "w4a16-gptq", Path("o"), "c.jsonl", ignore=("lm_head", "re:.*gate"),
                             num_samples=8, evaluate=False, nproc="2", lang="zh")
    args = command_args(request)
    assert args[:4] == ["convert", "m", "--recipe", "w4a16-gptq"]
    assert args[args.index("--out") + 1] == "o" and args[args.index("--num-samples") + 1] == "8"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--ignore"] == ["lm_head", "re:.*gate"]
    assert "--no-eval" in args and "--overwrite" not in args and args[args.index("--lang") + 1] == "zh"
    assert "--nproc" not in args   # each rank is one rank


class _Result:
    def __init__(self, decision: str) -> None:
        self.decision, self.warnings, self.integrity = decision, [], None
