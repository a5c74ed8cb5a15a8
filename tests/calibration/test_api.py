"""load_calibration (the --calib hook), the output folder, and failure modes."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from quantkit.calibration import SamplerConfig, calibrate, load_calibration
from quantkit.calibration.calibration_set import default_log_path
from quantkit.errors import QuantkitError


@pytest.fixture(scope="module")
def small_log(tmp_path_factory, default_rows):
    path = tmp_path_factory.mktemp("api") / "log.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in default_rows[:300]))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory, small_log, tokenizer):
    out = tmp_path_factory.mktemp("api-out") / "calib"
    return calibrate(small_log, tokenizer, SamplerConfig(num_samples=40, max_len=512, seed=5), out=out)


def test_folder_source_returns_saved_ids(saved, tokenizer):
    ids = load_calibration(saved.out, tokenizer, num_samples=40, max_seq_len=512, seed=0)
    assert ids == saved.input_ids
    assert all(1 <= len(x) <= 512 for x in ids)


def test_folder_subset_keeps_cells_and_truncates(saved, tokenizer):
    ids = load_calibration(saved.out, tokenizer, num_samples=20, max_seq_len=128, seed=0)
    assert len(ids) == 20 and all(len(x) <= 128 for x in ids)
    full = {tuple(s["input_ids"][:128]): (s["task"], s["bucket"]) for s in saved.samples}
    picked_cells = Counter(full[tuple(x)] for x in ids)
    assert len(picked_cells) == min(20, len({(s["task"], s["bucket"]) for s in saved.samples}))
    assert ids == load_calibration(saved.out, tokenizer, num_samples=20, max_seq_len=128, seed=0)


def test_folder_with_another_tokenizer_is_retokenised(saved, tokenizer):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"<unk>": 0, "the": 1}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")
    ids = load_calibration(saved.out, other, num_samples=5, max_seq_len=64, seed=0)
    assert len(ids) == 5 and all(set(x) <= {0, 1} for x in ids)


def test_raw_log_and_text_file_are_sampled_on_the_fly(small_log, tokenizer, tmp_path, real_units):
    ids = load_calibration(small_log, tokenizer, num_samples=16, max_seq_len=256, seed=1)
    assert len(ids) == 16 and all(len(x) <= 256 for x in ids)
    assert ids == load_calibration(small_log, tokenizer, num_samples=16, max_seq_len=256, seed=1)
    assert ids != load_calibration(small_log, tokenizer, num_samples=16, max_seq_len=256, seed=2)
    txt = tmp_path / "corpus.txt"
    txt.write_text("\n\n".join(" ".join(real_units["en"][i:i + 5]) for i in range(0, 200, 5)))
    ids = load_calibration(txt, tokenizer, num_samples=8, max_seq_len=64, seed=0)
    assert len(ids) == 8 and all(len(x) <= 64 for x in ids)


def test_embedded_default(tokenizer):
    assert default_log_path().stat().st_size <= 5 * 1024 * 1024
    ids = load_calibration("default", tokenizer, num_samples=32, max_seq_len=256, seed=0)
    assert len(ids) == 32 and all(len(x) <= 256 for x in ids)


def test_embedded_default_covers_the_brief(default_rows, tokenizer):
    """Chinese and English, >= 6 task types, a few dozen to > 4k tokens, numbers and code."""
    from quantkit.calibration.language import detect_language

    tasks = Counter(r["task"] for r in default_rows)
    assert len(tasks) >= 6 and min(tasks.values()) >= 100
    langs = Counter(detect_language(r["messages"][-1]["content"] if r["messages"][-1]["role"] == "user"
                                    else r["messages"][-2]["content"]) for r in default_rows)
    assert langs["zh"] >= 500 and langs["en"] >= 500
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in default_rows]
    lengths = sorted(len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"])
    assert lengths[0] < 64 and sum(n > 4096 for n in lengths) >= 20
    assert sum("```python" in t for t in texts) >= 200
    assert all("source" in r for r in default_rows)


def test_too_many_malformed_rows_fail_with_the_file_name(tmp_path, tokenizer):
    path = tmp_path / "dirty.jsonl"
    path.write_text("".join('{"text": "row %d is fine"}\n' % i for i in range(90)) + "{bad\n" * 10)
    with pytest.raises(QuantkitError, match=r"dirty\.jsonl: 10\.0% of 100 rows malformed .*bad_json 10 "
                                            r"\(first lines 91, 92, 93, 94, 95\)"):
        calibrate(path, tokenizer, num_samples=8)
    res = calibrate(path, tokenizer, num_samples=8, max_malformed_share=0.2)
    assert res.manifest["counts"]["malformed"] == 10


def test_output_is_replaced_atomically_and_guarded(saved, small_log, tokenizer, tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(QuantkitError, match="notes: output folder exists"):
        calibrate(small_log, tokenizer, num_samples=4, out=other)
    with pytest.raises(QuantkitError, match="notes exists and is not a quantkit output"):
        calibrate(small_log, tokenizer, num_samples=4, out=other, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"
    out = tmp_path / "calib"
    calibrate(small_log, tokenizer, num_samples=4, max_len=128, out=out)
    with pytest.raises(QuantkitError, match="calib: output folder exists"):
        calibrate(small_log, tokenizer, num_samples=6, max_len=128, out=out)
    calibrate(small_log, tokenizer, num_samples=6, max_len=128, out=out, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["counts"]["selected"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib", "notes"]  # no tmp-/old- leftovers


def test_tampered_samples_are_refused(saved, tokenizer, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved.out, copy)
    with open(copy / "samples.jsonl", "a") as fh:
        fh.write("{}\n")
    with pytest.raises(QuantkitError, match="samples.jsonl: sha256 differs"):
        load_calibration(copy, tokenizer, 4, 64)


def test_drop_policy_and_balanced(small_log, tokenizer):
    res = calibrate(small_log, tokenizer, num_samples=30, max_len=256, long_policy="drop", policy="balanced")
    c = res.manifest["counts"]
    assert c["dropped_too_long"] > 0 and c["truncated_source"] == 0
    selected = [x["selected"] for x in res.manifest["cells"]]
    assert max(selected) - min(selected) <= max(1, max(selected) // 2)
