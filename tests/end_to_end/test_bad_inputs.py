"""Bad input as a hostile but fair user gives it, one row per case.

Every case fails with exit code 2 and a single ``error:`` line, the last on stderr, that names
the file, key or flag at fault; nothing raises past the command (no traceback), and no file
or folder appears or changes anywhere the command could write: the case's own folder (the
parent of ``--out``), the shared inputs, the temporary folder and the working directory are
snapshotted before and after. What is worth knowing but not wrong is a warning instead: one
``warning:`` line on stderr, the same text in ``quantization_log.json``.

The commands run in-process (typer's CliRunner: an exception that escapes a command is the
traceback a user would see); two cases also run as ``python -m quantkit.cli`` to see the real
process's exit code and stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from model_factory import make_llama_dir, save_byte_tokenizer


@dataclass(frozen=True)
class World:
    """Inputs shared by the cases: never written by any of them."""

    root: Path
    model: Path      # a tiny Llama with a byte-level tokenizer
    quantized: Path  # that model converted with w8a16
    calib: Path      # a clean JSONL calibration log


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    import quantkit

    root = tmp_path_factory.mktemp("bad-inputs")
    model = make_llama_dir(root / "model", vocab=260)
    save_byte_tokenizer(model)
    quantkit.quantize(str(model), "w8a16").save(root / "w8a16")
    calib = root / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"Row {i}: the invoice total is {i * 17} euros."}) + "\n"
                             for i in range(40)))
    return World(root, model, root / "w8a16", calib)


@pytest.fixture
def private_dirs(tmp_path_factory, monkeypatch) -> list[Path]:
    """A temporary folder and a working directory of the test's own, so that what a command
    leaves in either is seen (and nothing else running on the machine is)."""
    tmp, cwd = tmp_path_factory.mktemp("tmpdir"), tmp_path_factory.mktemp("cwd")
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.chdir(cwd)
    return [tmp, cwd]


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every folder and file under ``roots``: files with their size and modification time."""
    out = {}
    for root in roots:
        for p in [root, *root.rglob("*")]:
            st = p.lstat()
            out[str(p)] = ("dir",) if p.is_dir() else ("file", st.st_size, st.st_mtime_ns)
    return out


def invoke(args: list) -> "object":
    from quantkit.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def convert(model: Path, tmp: Path, *extra, recipe: str | Path = "w8a16") -> list:
    return ["convert", model, "--recipe", recipe, "--out", tmp / "out", "--no-eval", *extra]


def evaluate(w: World, tmp: Path, *extra, candidate: Path | None = None) -> list:
    return ["eval", "--baseline", w.model, "--candidate", candidate or w.quantized, "--suite", "numbers-en",
            "--out", tmp / "report", *extra]


def model_copy(w: World, tmp: Path) -> Path:
    return Path(shutil.copytree(w.model, tmp / "model"))


def recipe_file(tmp: Path, text: str) -> Path:
    path = tmp / "recipe.yaml"
    path.write_text(text)
    return path


def calib_log(tmp: Path, good: int, bad: int) -> Path:
    rows = [json.dumps({"text": f"Row {i}: the parcel left the depot at {i % 24}:00."}) for i in range(good)]
    rows += ["{not json"] * bad
    path = tmp / "calib.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


GROUP = ("version: 1\nconfig_groups:\n  g:\n    targets: [Linear]\n"
         "    weights: {{num_bits: {bits}, type: int, symmetric: true, strategy: group, group_size: {gs}}}\n")

# -- the cases: name -> (world, the case's folder) -> (argv, what the error line names) ----------
Case = Callable[[World, Path], tuple[list, str]]
CASES: dict[str, Case] = {}
WARNINGS: dict[str, Case] = {}   # the same, but the command succeeds and warns


def into(table: dict[str, Case]) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        table[fn.__name__.replace("_", "-")] = fn
        return fn
    return register


case, warning_case = into(CASES), into(WARNINGS)


# inputs that once ended in tracebacks
@case
def config_not_json(w, tmp):
    m = model_copy(w, tmp)
    (m / "config.json").write_text("{not json")
    return convert(m, tmp), "config.json: not JSON"


@case
def untied_config_without_its_head(w, tmp):
    m = model_copy(w, tmp)
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    return convert(m, tmp), "tie_word_embeddings is false, but the checkpoint has no 'lm_head.weight'"


@case
def config_empty(w, tmp):
    m = model_copy(w, tmp)
    (m / "config.json").write_text("")
    return convert(m, tmp), "config.json: empty file"


@case
def int_9_bits(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, GROUP.format(bits=9, gs=32))), \
        "config_groups.g.weights.num_bits: int quantization supports 2..8 bits, got 9"


@case
def block_that_does_not_divide(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "version: 1\nscheme: FP8_BLOCK\n")), \
        "weights (model.layers.0.self_attn.q_proj): block_structure [128, 128] does not divide the weight [64, 64]"


@case
def activation_group_that_does_not_divide(w, tmp):
    text = ("version: 1\nscheme:\n  weights: {num_bits: 8, type: float, strategy: block, block_structure: [32, 32]}\n"
            "  input_activations: {num_bits: 8, type: float, strategy: group, group_size: 48, dynamic: true}\n")
    return convert(w.model, tmp, recipe=recipe_file(tmp, text)), \
        "input_activations (model.layers.0.self_attn.q_proj): group_size 48 does not divide in_features 64"


@case
def recipe_top_level_list(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "- scheme: W4A16\n")), \
        "recipe.yaml: expected a mapping, got a list"


@case
def recipe_is_a_folder(w, tmp):
    (tmp / "recipes.yaml").mkdir()
    return convert(w.model, tmp, recipe=tmp / "recipes.yaml"), "recipes.yaml: is a folder, not a recipe file"


@case
def calib_folder_with_bare_dataset_info(w, tmp):
    (tmp / "calib").mkdir()
    (tmp / "calib" / "dataset_info.json").write_text("{}")
    return convert(w.model, tmp, "--calib", tmp / "calib", recipe="w8a16-gptq"), \
        "calib: not a readable HF datasets folder"


@case
def out_parent_is_a_file(w, tmp):
    (tmp / "file").write_text("x")
    return ["convert", w.model, "--recipe", "w8a16", "--out", tmp / "file" / "out", "--no-eval"], \
        "file is a file, not a folder"


@case
def out_parent_not_writable(w, tmp):
    if os.geteuid() == 0:  # root writes through file modes; sysfs refuses even root a new folder
        if not Path("/sys").is_dir():
            pytest.skip("no /sys to stand for a folder root cannot write")
        return ["convert", w.model, "--out", "/sys/quantkit-out", "--no-eval"], \
            "/sys/quantkit-out: cannot create the output folder in /sys"
    (tmp / "ro").mkdir(mode=0o555)
    return ["convert", w.model, "--out", tmp / "ro" / "out", "--no-eval"], "cannot create the output folder in"


@case
def ignore_bad_regex(w, tmp):
    return convert(w.model, tmp, "--ignore", "re:["), "--ignore: 're:[' is not a valid regular expression"


@case
def device_cuda_without_cuda(w, tmp):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    return convert(w.model, tmp, "--device", "cuda"), "--device: 'cuda' asked for"


@case
def device_tpu(w, tmp):
    return convert(w.model, tmp, "--device", "tpu"), "--device: 'tpu' is not a device name"


@case
def card_language_unknown(w, tmp):
    return convert(w.model, tmp, "--lang", "zh-TW"), "--lang: expected one of en, zh, got 'zh-TW'"


@case
def eval_truncated_plain_candidate(w, tmp):
    m = model_copy(w, tmp)
    truncate(m / "model.safetensors")
    return evaluate(w, tmp, candidate=m), "model.safetensors: not a valid safetensors file"


# inputs that were once accepted or ignored silently
@case
def group_size_true(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "scheme: W4A16\ngroup_size: true\n")), \
        "group_size: expected an integer, got True"


@case
def group_size_true_in_config_groups(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, GROUP.format(bits=4, gs="true"))), \
        "config_groups.g.weights.group_size: expected an integer, got True"


@case
def eval_max_len_zero(w, tmp):
    return evaluate(w, tmp, "--max-len", "0"), "--max-len: must be >= 16, got 0"


@case
def eval_empty_suite_folder(w, tmp):
    (tmp / "suite").mkdir()
    return evaluate(w, tmp, "--suite", tmp / "suite"), "suite holds no .jsonl slice files"


@case
def eval_suite_with_an_empty_slice(w, tmp):
    (tmp / "suite").mkdir()
    (tmp / "suite" / "mine.jsonl").write_text("\n")
    return evaluate(w, tmp, "--suite", tmp / "suite"), "mine.jsonl: no items"


@case
def already_quantized_model(w, tmp):
    return convert(w.quantized, tmp), "w8a16: already quantized"


@case
def ignore_matching_nothing(w, tmp):
    return convert(w.model, tmp, "--ignore", "model.layers.0.mlp.down"), \
        "--ignore: 'model.layers.0.mlp.down' matches no Linear module"


# found on the way
@case
def scheme_target_bad_regex(w, tmp):
    text = "config_groups:\n  g:\n    targets: ['re:(']\n    weights: {num_bits: 8}\n"
    return convert(w.model, tmp, recipe=recipe_file(tmp, text)), \
        "config_groups.g.targets[0]: 're:(' is not a valid regular expression"


@case
def calib_text_without_a_tokenizer(w, tmp):
    m = model_copy(w, tmp)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (m / f).unlink()
    return convert(m, tmp, "--calib", w.calib, recipe="w8a16-gptq"), "model: no tokenizer files"


@case
def eval_device_tpu(w, tmp):
    return evaluate(w, tmp, "--device", "tpu"), "--device: 'tpu'"


@case
def eval_out_parent_is_a_file(w, tmp):
    (tmp / "file").write_text("x")
    return evaluate(w, tmp)[:-2] + ["--out", tmp / "file" / "report"], "file is a file, not a folder"


@case
def eval_slice_row_not_an_object(w, tmp):
    (tmp / "suite").mkdir()
    (tmp / "suite" / "mine.jsonl").write_text('[1, 2]\n')
    return evaluate(w, tmp, "--suite", tmp / "suite"), "mine.jsonl:1: expected a JSON object, got list"


@case
def eval_calib_row_not_an_object(w, tmp):
    (tmp / "log.jsonl").write_text('{"text": "fine"}\n"just a string"\n')
    return evaluate(w, tmp, "--calib", tmp / "log.jsonl"), "log.jsonl:2: expected a JSON object, got str"


# refusals that already held, kept
@case
def truncated_safetensors(w, tmp):
    m = model_copy(w, tmp)
    truncate(m / "model.safetensors")
    return convert(m, tmp), "model.safetensors: not a valid safetensors file"


@case
def corrupt_safetensors_header(w, tmp):
    m = model_copy(w, tmp)
    data = bytearray((m / "model.safetensors").read_bytes())
    data[8:40] = b"\xff" * 32
    (m / "model.safetensors").write_bytes(bytes(data))
    return convert(m, tmp), "model.safetensors: not a valid safetensors file"


@case
def missing_tensor(w, tmp):
    m = model_copy(w, tmp)
    tensors = load_file(str(m / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(m / "model.safetensors"), metadata={"format": "pt"})
    return convert(m, tmp), "tensor 'model.layers.1.mlp.up_proj.weight' is missing"


@case
def pickle_only_folder(w, tmp):
    m = model_copy(w, tmp)
    (m / "model.safetensors").rename(m / "pytorch_model.bin")
    return convert(m, tmp), "pytorch_model.bin: pickle checkpoints are not loaded"


@case
def model_type_transformers_cannot_build(w, tmp):
    m = model_copy(w, tmp)
    cfg = json.loads((m / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "fancynet", ["FancyNetForCausalLM"]
    (m / "config.json").write_text(json.dumps(cfg))
    return convert(m, tmp, recipe="w8a16-gptq"), "model type `fancynet`"


@case
def group_size_that_does_not_divide(w, tmp):
    return convert(w.model, tmp, "--group-size", "48", recipe="w4a16"), "group_size 48 does not divide in_features 64"


@case
def group_size_checked_before_calibration_is_read(w, tmp):
    return convert(w.model, tmp, "--group-size", "48", "--calib", tmp / "missing.jsonl", recipe="w4a16-gptq"), \
        "group_size 48 does not divide in_features 64"


@case
def group_size_zero(w, tmp):
    return convert(w.model, tmp, "--group-size", "0", recipe="w4a16"), "--group-size: group_size: must be > 0"


@case
def unknown_recipe_key(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "scheme: W8A16\nalgorithm: {name: rtn, blocksize: 4}\n")), \
        "unknown key 'blocksize'"


@case
def calib_log_mostly_malformed(w, tmp):
    return convert(w.model, tmp, "--calib", calib_log(tmp, good=30, bad=10), recipe="w8a16-gptq"), \
        "25.0% of 40 rows malformed (limit 5%)"


@case
def existing_output(w, tmp):
    (tmp / "out").mkdir()
    (tmp / "out" / "keep.txt").write_text("mine")
    return convert(w.model, tmp), "out: output folder exists (use --overwrite to replace an earlier quantkit output)"


# the kv_cache: section
@case
def kv_cache_channel_strategy(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "scheme: FP8_DYNAMIC\nkv_cache: {strategy: channel}\n")), \
        "kv_cache.strategy: must be 'tensor' or 'attn_head', got 'channel'"


@case
def kv_cache_int4(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "scheme: FP8_DYNAMIC\nkv_cache: {num_bits: 4}\n")), \
        "kv_cache.num_bits: the KV cache is FP8 E4M3 (8 bits), got 4"


@case
def kv_cache_unknown_key(w, tmp):
    return convert(w.model, tmp, recipe=recipe_file(tmp, "scheme: FP8_DYNAMIC\nkv_cache: {stratgy: tensor}\n")), \
        "kv_cache: unknown key 'stratgy'"


# target precedence: two groups as specific as each other for one module
@case
def two_groups_tie_on_a_module(w, tmp):
    text = ("config_groups:\n  mlp4:\n    targets: ['re:.*mlp\\..*']\n    weights: {num_bits: 4, group_size: 32}\n"
            "  down8:\n    targets: ['re:.*down_proj']\n    weights: {num_bits: 8}\n")
    return convert(w.model, tmp, "--calib", tmp / "missing.jsonl", recipe=recipe_file(tmp, text)), \
        "recipe.yaml: config_groups.mlp4 and config_groups.down8 both target 'model.layers.0.mlp.down_proj' by regex"


# mixed precision: the budget is checked against the candidates' sizes before any data is read
@case
def budget_zero(w, tmp):
    return convert(w.model, tmp, "--budget", "0", recipe="w4a16-g64"), "--budget: must be > 0.0, got 0.0"


@case
def budget_below_every_plan(w, tmp):
    return convert(w.model, tmp, "--budget", "2", "--calib", tmp / "missing.jsonl", recipe="w4a16-g64"), \
        "budget: 2.0 bits per weight is below the smallest plan of these candidates"


@case
def budget_with_a_missing_sensitivity_file(w, tmp):
    return convert(w.model, tmp, "--budget", "6", "--sensitivity", tmp / "nope.json", recipe="w4a16-g64"), \
        "nope.json: sensitivity file not found"


@case
def mixed_unknown_candidate(w, tmp):
    text = "scheme: W4A16\ngroup_size: 32\nmixed: {budget_bits: 6, candidates: [W4_G32, W3]}\n"
    return convert(w.model, tmp, recipe=recipe_file(tmp, text)), "recipe.yaml: mixed.candidates[1]: unknown candidate 'W3'"


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(name, world, tmp_path, private_dirs):
    args, needle = CASES[name](world, tmp_path)
    roots = [world.root, tmp_path, *private_dirs]
    before = snapshot(*roots)
    r = invoke(args)
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exception, r.output)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines == errors, r.stderr      # the one line: no banner, no progress
    assert needle in errors[0], errors[0]
    assert "Traceback" not in r.output
    assert snapshot(*roots) == before


@pytest.mark.parametrize("name", ["device-tpu", "eval-truncated-plain-candidate"])
def test_bad_input_in_a_real_process(name, world, tmp_path):
    args, needle = CASES[name](world, tmp_path)
    before = snapshot(world.root, tmp_path)
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and needle in lines[-1], res.stderr
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert snapshot(world.root, tmp_path) == before


# -- what is allowed, but said: one warning line, recorded in quantization_log.json -----------
@warning_case
def calib_rows_malformed_under_the_limit(w, tmp):
    return convert(w.model, tmp, "--calib", calib_log(tmp, good=39, bad=1), "--num-samples", "4",
                   "--max-seq-len", "32", recipe="w8a16-gptq"), \
        "calib.jsonl: 1 of 40 rows malformed and skipped (under the 5% limit): bad_json 1 (first lines 40)"


@warning_case
def calib_for_a_recipe_without_calibration(w, tmp):
    return convert(w.model, tmp, "--calib", w.calib), "--calib: recipe 'w8a16' takes no calibration data"


@warning_case
def recipe_ignore_matching_nothing(w, tmp):
    recipe = recipe_file(tmp, "scheme: W8A16\nignore: [lm_head, 're:.*mlp\\.gate$']\n")
    return convert(w.model, tmp, recipe=recipe), "ignore: 're:.*mlp\\.gate$' matches no Linear module"


@warning_case
def fewer_calibration_samples_than_asked(w, tmp):
    return convert(w.model, tmp, "--calib", calib_log(tmp, good=6, bad=0), "--num-samples", "16",
                   "--max-seq-len", "32", recipe="w8a16-gptq"), "6 samples drawn, 16 asked"


@pytest.mark.parametrize("name", sorted(WARNINGS))
def test_warning_is_one_line_and_recorded(name, world, tmp_path, private_dirs):
    args, needle = WARNINGS[name](world, tmp_path)
    r = invoke(args)
    assert r.exit_code == 0, (r.exception, r.output)
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and needle in warnings[0], r.stderr
    log = json.loads((tmp_path / "out" / "quantization_log.json").read_text())
    assert log["warnings"] == [warnings[0].removeprefix("warning: ")]


def test_a_clean_run_records_no_warnings(world, tmp_path, private_dirs):
    r = invoke(convert(world.model, tmp_path, "--calib", world.calib, "--num-samples", "4", "--max-seq-len", "32",
                       recipe="w8a16-gptq"))
    assert r.exit_code == 0, r.output
    assert "warning:" not in r.stderr
    assert json.loads((tmp_path / "out" / "quantization_log.json").read_text())["warnings"] == []


def test_a_bad_heap_huge_pages_setting_is_one_line_exit_2_and_leaves_nothing(world, tmp_path, private_dirs, monkeypatch):
    """An environment variable is input too: named on the one line, before anything is written."""
    from quantkit.pipeline import memory

    monkeypatch.setenv("QUANTKIT_HEAP_HUGE_PAGES", "on")
    memory._huge_page_size.cache_clear()
    roots = [world.root, tmp_path, *private_dirs]
    before = snapshot(*roots)
    try:
        r = invoke(convert(world.model, tmp_path))
    finally:
        monkeypatch.delenv("QUANTKIT_HEAP_HUGE_PAGES")
        memory._huge_page_size.cache_clear()
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exception, r.output)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: QUANTKIT_HEAP_HUGE_PAGES: 'on' is not 0 or 1"), r.stderr
    assert snapshot(*roots) == before
