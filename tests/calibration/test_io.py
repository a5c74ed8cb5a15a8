import json

import pytest

from quantkit.calibration.io import file_sha256, read_log
from quantkit.errors import QuantkitError


def test_jsonl_counts_each_reason_with_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"text": "ok one"}\n{broken\n\n{"text": "caf\xe9"}\n[1, 2]\n{"text": "ok two"}\n')
    log = read_log(path)
    assert [line for line, _ in log.records] == [1, 6]
    assert log.malformed.to_dict() == {"bad_encoding": {"count": 1, "first_lines": [4]},
                                       "bad_json": {"count": 1, "first_lines": [2]},
                                       "not_an_object": {"count": 1, "first_lines": [5]}}


def test_first_lines_are_capped_but_counts_are_not(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(["{bad"] * 12 + ['{"text": "x"}']))
    log = read_log(path)
    assert log.malformed.counts == {"bad_json": 12}
    assert log.malformed.first_lines["bad_json"] == [1, 2, 3, 4, 5]


def test_csv_with_chat_column_and_bad_rows(tmp_path):
    path = tmp_path / "log.csv"
    chat = json.dumps([{"role": "user", "content": "你好, 世界"}], ensure_ascii=False).replace('"', '""')
    path.write_bytes(('task,messages\nchat,"' + chat + '"\nqa,"multi\nline text"\n').encode()
                     + b'chat,"caf\xe9"\nchat,a,extra\n')
    log = read_log(path)
    assert log.records[0] == (2, {"task": "chat", "messages": [{"role": "user", "content": "你好, 世界"}]})
    assert log.records[1] == (3, {"task": "qa", "messages": "multi\nline text"})
    assert log.malformed.to_dict() == {"bad_encoding": {"count": 1, "first_lines": [5]},
                                       "wrong_column_count": {"count": 1, "first_lines": [6]}}


def test_parquet_and_hf_dataset_folder(tmp_path):
    import datasets

    rows = [{"prompt": f"question {i}", "completion": f" answer {i}"} for i in range(5)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "log.parquet"))
    ds.save_to_disk(str(tmp_path / "ds"))
    for source in (tmp_path / "log.parquet", tmp_path / "ds"):
        log = read_log(source)
        assert [r for _, r in log.records] == rows
        assert [line for line, _ in log.records] == [1, 2, 3, 4, 5]
    assert len(file_sha256(tmp_path / "ds")) == 64


def test_text_file_documents_split_on_blank_lines(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"first doc\nstill first\n\n\nsecond \xff doc\n\nthird doc\n")
    log = read_log(path)
    assert log.records == [(1, {"text": "first doc\nstill first"}), (7, {"text": "third doc"})]
    assert log.malformed.counts == {"bad_encoding": 1}


@pytest.mark.parametrize("name", ["missing.jsonl", "log.xlsx"])
def test_unusable_paths_are_one_line_errors(tmp_path, name):
    if name.endswith("xlsx"):
        (tmp_path / name).write_text("x")
    with pytest.raises(QuantkitError, match=name):
        read_log(tmp_path / name)


def test_json_array_file(tmp_path):
    path = tmp_path / "log.json"
    path.write_text('[{"text": "a"}, 3, {"text": "b"}]')
    log = read_log(path)
    assert log.records == [(1, {"text": "a"}), (3, {"text": "b"})]
    assert log.malformed.first_lines == {"not_an_object": [2]}
