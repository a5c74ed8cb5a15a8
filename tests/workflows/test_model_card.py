"""Every converted checkpoint carries a model card (README.md, Hugging Face convention): front
matter a hub reads, the recipe, how to load it, the calibration set without its text, the size,
the verdict once the evaluation ran, and the base model's card below; in English, or in Chinese
with ``--lang zh`` (the same front matter)."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

import quantkit
from model_factory import make_llama_dir, save_byte_tokenizer
from quantkit.workflows.model_card import BASE_CARD_HEADING, own_card_parts, split_card, write_card

BASE_CARD = "---\nlanguage:\n- en\n- zh\nlicense: mit\npipeline_tag: text-generation\n---\nThe base model's own words.\n"
MARKER = "zebra-quokka-4411"   # calibration text that must never reach the card


def _front(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card[4:card.index("\n---\n", 4)])


def test_the_card_front_matter_and_what_it_leaves_out(tmp_path):
    model = make_llama_dir(tmp_path / "base", num_layers=1, hidden=64, intermediate=128, seed=3)
    save_byte_tokenizer(model)
    (model / "README.md").write_text(BASE_CARD)
    texts = [f"{MARKER} the quick brown fox number {i} jumps over the lazy dog" for i in range(8)]
    q = quantkit.quantize(str(model), "w4a16-g64-gptq", calibration=texts)
    card = (q.save(tmp_path / "out") / "README.md").read_text()
    front = _front(card)
    assert front["base_model"] == "base" and front["library_name"] == "transformers"
    assert {"compressed-tensors", "quantkit", "w4a16", "pack-quantized"} <= set(front["tags"])
    assert front["license"] == "mit" and front["language"] == ["en", "zh"]
    assert front["pipeline_tag"] == "text-generation"
    assert "| Recipe | `w4a16-g64-gptq` |" in card and "group size 64" in card
    assert "| Calibration | 8 samples" in card and MARKER not in card
    assert "vllm serve" in card and "AutoModelForCausalLM.from_pretrained" in card
    assert "Not evaluated yet" in card
    assert card.endswith(f"{BASE_CARD_HEADING}\n\nThe base model's own words.\n")


def test_the_verdict_joins_the_card_and_nothing_doubles(tmp_path):
    model = make_llama_dir(tmp_path / "base", num_layers=1, hidden=64, intermediate=128, seed=3)
    (model / "README.md").write_text(BASE_CARD)
    out = quantkit.quantize(str(model), "w8a16").save(tmp_path / "out")
    before = (out / "README.md").read_text()
    (out / "eval").mkdir()
    verdict = {"decision": "REVIEW", "slices": {"numbers-en": "REVIEW", "code-en": "GO"},
               "reasons": [{"slice": "numbers-en", "text": "numbers-en: kl_mean 0.07 > 0.06"}]}
    (out / "eval" / "report.json").write_text(json.dumps({"verdict": verdict}))
    write_card(out)
    card = (out / "README.md").read_text()
    # the reason as Markdown text (md_text), as every cell of the card that may hold user text
    assert "**REVIEW**" in card and "| numbers-en | REVIEW | numbers-en: kl_mean 0.07 > 0.06 |" in card
    assert "| code-en | GO |  |" in card and "Not evaluated yet" not in card
    assert _front(card) == _front(before)                    # the same base model, terms and tags
    assert card.count(BASE_CARD_HEADING) == 1 and card.count("The base model's own words.") == 1
    write_card(out)
    assert (out / "README.md").read_text() == card           # rendered from the files: the same bytes


def test_split_card_survives_a_card_that_is_not_yaml():
    assert split_card("---\n: [unclosed\n---\nbody\n") == ({}, "body\n")
    assert split_card("---\n- a list\n---\nbody\n") == ({}, "body\n")


def test_a_base_card_in_another_encoding_does_not_fail_the_conversion(tmp_path):
    model = make_llama_dir(tmp_path / "base", num_layers=1, hidden=64, intermediate=128, seed=3)
    (model / "README.md").write_bytes("---\nlicense: mit\n---\nMod\xe8le de base\n".encode("latin-1"))
    card = (quantkit.quantize(str(model), "w8a16").save(tmp_path / "out") / "README.md").read_text()
    assert _front(card)["license"] == "mit" and card.endswith("Mod\ufffdle de base\n")


CJK = re.compile(r"[\u4e00-\u9fff]")


def _headings(card: str) -> list[str]:
    """The Markdown headings of the card's body, code blocks left out."""
    body = re.sub(r"^```.*?^```", "", split_card(card)[1], flags=re.S | re.M)
    return [line for line in body.splitlines() if line.startswith("#")]


def test_the_chinese_card_has_the_same_front_matter_and_chinese_headings(tmp_path):
    model = make_llama_dir(tmp_path / "base", num_layers=1, hidden=64, intermediate=128, seed=3)
    save_byte_tokenizer(model)
    (model / "README.md").write_text(BASE_CARD)
    texts = [f"{MARKER} the quick brown fox number {i} jumps over the lazy dog" for i in range(8)]
    q = quantkit.quantize(str(model), "w4a16-g64-gptq", calibration=texts, options=quantkit.ConvertOptions(lang="zh"))
    out = q.save(tmp_path / "out")
    card = (out / "README.md").read_text(encoding="utf-8")
    front = _front(card)
    assert front["base_model"] == "base" and front["library_name"] == "transformers"
    assert {"compressed-tensors", "quantkit", "w4a16", "pack-quantized"} <= set(front["tags"])
    assert front["license"] == "mit" and front["language"] == ["en", "zh"]
    assert _headings(card) == ["# `base`：quantkit 量化版（`w4a16-g64-gptq`）", "## 使用方法", "## 评估结果",
                               "## 基础模型的模型卡"]
    assert all(CJK.search(h) for h in _headings(card))
    assert "| 配方 | `w4a16-g64-gptq` |" in card and "组大小 64" in card and "| 校准数据 | 8 条样本" in card
    assert MARKER not in card and "尚未评估" in card
    assert "vllm serve ./this-folder" in card and "AutoModelForCausalLM.from_pretrained" in card
    assert card.endswith("## 基础模型的模型卡\n\nThe base model's own words.\n")
    write_card(out, lang="en")                              # the same checkpoint's English card
    english = (out / "README.md").read_text(encoding="utf-8")
    assert _front(english) == front and "## Use it" in english and not CJK.search(split_card(english)[1])


def test_the_verdict_keeps_the_card_in_the_language_it_was_written_in(tmp_path):
    model = make_llama_dir(tmp_path / "base", num_layers=1, hidden=64, intermediate=128, seed=3)
    (model / "README.md").write_text(BASE_CARD)
    out = quantkit.quantize(str(model), "w8a16", options=quantkit.ConvertOptions(lang="zh")).save(tmp_path / "out")
    before = (out / "README.md").read_text(encoding="utf-8")
    (out / "eval").mkdir()
    verdict = {"decision": "NO-GO", "slices": {"numbers-en": "NO-GO"},
               "reasons": [{"slice": "numbers-en", "text": "numbers-en: kl_mean 0.2 > 0.1"}]}
    (out / "eval" / "report.json").write_text(json.dumps({"verdict": verdict}))
    write_card(out)                                         # no language given: the card's own
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "结论为 **NO-GO**" in card and "| 切片 | 级别 | 首要原因 |" in card
    assert "| numbers-en | NO-GO | numbers-en: kl_mean 0.2 > 0.1 |" in card and "尚未评估" not in card
    assert _front(card) == _front(before) and card.count("The base model's own words.") == 1
    write_card(out)
    assert (out / "README.md").read_text(encoding="utf-8") == card


def test_a_base_card_with_the_other_languages_headings_is_read_back_as_it_was():
    chinese_base = "## 使用方法\n\n## 基础模型的模型卡\n\n中文原文。\n"
    english = f"# m\n\n## Use it\n\n...\n\n{BASE_CARD_HEADING}\n\n{chinese_base}"
    assert own_card_parts(english) == ("en", chinese_base)
    english_base = f"## Use it\n\n{BASE_CARD_HEADING}\n\nWords.\n"
    chinese = f"# m\n\n## 使用方法\n\n...\n\n## 基础模型的模型卡\n\n{english_base}"
    assert own_card_parts(chinese) == ("zh", english_base)


def test_an_unknown_card_language_is_refused_when_the_options_are_built():
    with pytest.raises(quantkit.QuantkitError, match="lang: expected one of en, zh, got 'fr'"):
        quantkit.ConvertOptions(lang="fr")


def test_convert_lang_zh_writes_the_card_in_chinese(tiny_llama, tmp_path):
    from quantkit.cli import app

    run = CliRunner().invoke(app, ["convert", str(tiny_llama), "--recipe", "w8a16", "--lang", "zh", "--no-eval",
                                   "--out", str(tmp_path / "out")])
    assert run.exit_code == 0, run.output
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert "## 使用方法" in card and "## Use it" not in card and _front(card)["library_name"] == "transformers"


HOSTILE_NAMES = ["# heading", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))", "a`b``c", "x|y\nz",
                 "![i](http://127.0.0.1/x.png)"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_model_name_stays_text_in_the_card(name):
    """A model folder or recipe named with Markdown or HTML reaches the card as code spans only:
    no heading, no tag, no link, no image comes from it."""
    from markdown_it import MarkdownIt

    from quantkit.workflows.model_card import CardFacts, render

    facts = CardFacts(base_model=name, recipe=name, groups=[], ignore=[name], kv_cache=None, shard_bytes=1,
                      shards=1, calibration={}, verdict={"decision": "GO", "slices": {name: "GO"},
                                                         "reasons": [{"slice": name, "text": name}]},
                      base_body="", lang="en")
    card = render(facts)
    body = card.split("---\n", 2)[2]
    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    children = [c for t in tokens for c in (t.children or [])]
    assert not {t.type for t in tokens} & {"html_block"} and not [c for c in children if c.type == "image"]
    # the only HTML is the card's own line break inside a cell
    assert {c.content for c in children if c.type == "html_inline"} <= {"<br>"}
    links = [c.attrs.get("href") for t in tokens for c in (t.children or []) if c.type == "link_open"]
    assert all(str(h).startswith("https://") for h in links), links
    assert sum(t.type == "heading_open" and t.tag == "h1" for t in tokens) == 1


def test_a_vision_language_checkpoints_snippet_loads_it_with_its_own_class(tmp_path):
    """The causal-LM auto class does not build Qwen2.5-VL: the card names the class that does, and
    its snippet, run as written, loads the checkpoint."""
    from families import make_family_dir

    folder = make_family_dir("Qwen2.5-VL", tmp_path / "vl")
    out = quantkit.quantize(str(folder), "w8a16").save(tmp_path / "out")
    card = (out / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert "from transformers import Qwen2_5_VLForConditionalGeneration" in code
    scope: dict = {}
    exec(code.replace("./this-folder", str(out)), scope)   # noqa: S102 (the card's own snippet)
    assert type(scope["model"]).__name__ == "Qwen2_5_VLForConditionalGeneration"
