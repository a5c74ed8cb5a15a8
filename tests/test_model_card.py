"""Every converted checkpoint carries a model card (README.md, Hugging Face convention): front
matter a hub reads, the recipe, how to load it, the calibration set without its text, the size,
the verdict once the evaluation ran, and the base model's card below."""
from __future__ import annotations

import json

import yaml

import quantkit
from model_factory import make_llama_dir, save_byte_tokenizer
from quantkit.workflows.model_card import BASE_CARD_HEADING, split_card, write_card

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
