"""Language gating: only the slices in the model's languages (explicit option, recipe, the
baseline's model card, else all) change the decision; the others are measured, shown and
listed as information. Business slices always gate."""
import json
from dataclasses import replace

import pytest
import yaml
from report_html import parse
from tiny import FAST, TINY_THRESHOLDS, _take, non_ascii_scrambled

import quantkit
from quantkit.errors import QuantkitError
from quantkit.evaluation import evaluate, load_suite
from quantkit.workflows.evaluate import evaluate_paths
from quantkit.evaluation.business import business_slices
from quantkit.evaluation.languages import (LanguageGate, language_gate, model_card_languages,
                                           parse_languages, slice_language)
from quantkit.evaluation.eval_section import check_eval_section
from quantkit.evaluation.slices import Slice, SuiteOptions
from quantkit.evaluation.verdict import GO, NOGO, REVIEW, decide
from quantkit.recipe import load_recipe

CARD_EN = "---\nlanguage:\n- en\nlicense: apache-2.0\n---\nA tiny English test model.\n"
# teacher-forced text measures only: the task measures have their own tests
OPTS = SuiteOptions(**{**FAST.__dict__, "gen_prompts": 0, "extract_items": 0, "mc_items": 0, "code_items": 0})
CHINESE = "客户张伟要求退还订单８８－１２３的４２５０元，并于一九九八年一月前答复。"


# --- where a slice's language and the gating languages come from ---------------------

def test_slice_language_from_items_or_name_suffix():
    assert slice_language("numbers-zh", [{"kind": "text", "text": "x"}]) == "zh"
    assert slice_language("faq", [{"language": "zh-CN"}, {"language": "zh"}]) == "zh"
    assert slice_language("faq-en", [{"language": "de"}, {}]) == "en"  # items disagree: the suffix
    assert slice_language("faq", [{"kind": "text"}]) is None
    assert [s.language for s in load_suite("numbers-en,long-zh")] == ["en", "zh"]


def test_business_slices_have_no_language(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"text": CHINESE, "task": "support-zh"}, ensure_ascii=False) + "\n")
    [b] = business_slices(log)
    assert b.name == "business:support-zh" and b.language is None and not b.public
    assert LanguageGate(("en",), "model card").gates(b.language, b.public)


@pytest.mark.parametrize("card, langs", [
    (CARD_EN, ("en",)),
    ("---\nlanguage: zh-CN\n---\n", ("zh",)),
    ("---\nlanguage: [en, fr, en]\nlicense: mit\n---\n", ("en", "fr")),
    ("---\r\nlanguage:\r\n- en\r\n---\r\n", ("en",)),
    ("---\nlanguage: [multilingual]\n---\n", None),
    ("---\nlicense: mit\n---\n", None),
    ("---\nlanguage: [en\n---\n", None),          # broken YAML: no card
    ("# Model\nlanguage: en\n", None),             # no front matter
])
def test_model_card_front_matter(tmp_path, card, langs):
    (tmp_path / "README.md").write_text(card)
    assert model_card_languages(tmp_path) == langs


def test_precedence_explicit_then_card_then_all(tmp_path):
    assert model_card_languages(tmp_path) is None
    assert language_gate(None, tmp_path) == LanguageGate(None, "every language")
    (tmp_path / "README.md").write_text(CARD_EN)
    assert language_gate(None, tmp_path) == LanguageGate(("en",), "model card")
    assert language_gate("en,zh", tmp_path) == LanguageGate(("en", "zh"), "--languages")
    assert language_gate(["zh"], tmp_path, "eval.languages") == LanguageGate(("zh",), "eval.languages")
    assert language_gate(None, tmp_path).why_not() == "not gated (model card languages: en)"


@pytest.mark.parametrize("bad, message", [
    (3, "expected a list of language codes"),
    ("", "at least one language code"),
    (["en", "english"], "'english' is not a language code"),
])
def test_bad_languages_name_the_key(bad, message):
    with pytest.raises(QuantkitError, match=f"eval.languages: .*{message}"):
        parse_languages(bad, "eval.languages")


def test_recipe_eval_languages_is_checked_when_the_recipe_loads():
    # the entry points (convert, eval) load recipes with the evaluation package's checker
    def load(section):
        return load_recipe({"scheme": "W8A16", "eval": section}, check_eval=check_eval_section)

    assert load({"languages": ["en", "zh"]}).eval["languages"] == ["en", "zh"]
    with pytest.raises(QuantkitError, match="recipe: eval.languages: 'english' is not a language code"):
        load({"languages": "english"})
    with pytest.raises(QuantkitError, match="recipe: eval: unknown key 'langauges'"):
        load({"langauges": ["en"]})
    with pytest.raises(QuantkitError, match=r"recipe: eval.thresholds.kl_maen: unknown measure"):
        load({"thresholds": {"kl_maen": {"review": 1}}})
    with pytest.raises(QuantkitError, match=r"recipe: eval.max_len: must be >= 16, got 8"):
        load({"max_len": 8})
    with pytest.raises(QuantkitError, match=r"recipe: eval.options.text_items: expected an integer, got 1.5"):
        load({"options": {"text_items": 1.5}})


# --- the decision ---------------------------------------------------------------------

def test_informational_reasons_never_change_the_decision():
    measures = {"numbers-en": {"kl_mean": 0.001}, "numbers-zh": {"kl_mean": 5.0},
                "names-zh": {"top1_agreement": 0.1}}
    off = {"numbers-zh": "not gated (--languages: en)", "names-zh": "not gated (--languages: en)"}
    v = decide(measures, not_gated=off)
    assert v.decision == GO and v.reasons == []
    assert v.slices == {"numbers-en": GO, "numbers-zh": NOGO, "names-zh": NOGO}  # would-be levels
    assert {r.slice for r in v.informational} == {"numbers-zh", "names-zh"}
    assert all(r["note"] == off[r["slice"]] for r in v.to_dict()["informational"])
    # a gated slice still decides, and only its breach is a reason
    v = decide({**measures, "numbers-en": {"kl_mean": 0.08}}, not_gated=off)
    assert v.decision == REVIEW and [r.slice for r in v.reasons] == ["numbers-en"]
    assert decide(measures).decision == NOGO  # the same numbers with every language gating


@pytest.fixture(scope="module")
def zh_broken(base, tok):
    return non_ascii_scrambled(base, tok)


@pytest.fixture(scope="module")
def suite():
    return [_take(s, 3) for s in load_suite("numbers-en,names-zh")]


def run(base, cand, tok, suite, **kw):
    return evaluate(base, cand, tok, suite=suite, max_len=256, thresholds=TINY_THRESHOLDS, options=OPTS,
                    progress=False, **kw)


def test_explicit_languages_gate(base, tok, zh_broken, suite):
    en = run(base, zh_broken, tok, suite, languages="en")
    assert en.verdict.slices == {"numbers-en": GO, "names-zh": NOGO}
    assert en.decision == GO and en.verdict.reasons == []
    assert {r.slice for r in en.verdict.informational} == {"names-zh"}
    assert en.verdict.not_gated == {"names-zh": "not gated (--languages: en)"}
    both = run(base, zh_broken, tok, suite, languages=["en", "zh"])
    assert both.decision == NOGO and {r.slice for r in both.verdict.reasons} == {"names-zh"}
    assert both.verdict.informational == [] and both.slices == en.slices


def test_business_slices_always_gate(base, tok, zh_broken, suite):
    business = Slice("business:support", [{"id": "r1", "kind": "text", "text": CHINESE * 3}], public=False)
    # its one row is the evidence this test asks for (a slice short of evidence could not decide alone)
    opts = replace(OPTS, business_scored_tokens=8)
    r = evaluate(base, zh_broken, tok, suite=suite + [business], max_len=256, thresholds=TINY_THRESHOLDS,
                 options=opts, progress=False, languages="en")
    assert r.decision == NOGO
    assert {x.slice for x in r.verdict.reasons} == {"business:support"}
    assert {x.slice for x in r.verdict.informational} == {"names-zh"}


def test_model_card_of_the_baseline_folder(base, tok, zh_broken, suite, tmp_path):
    from transformers import AutoModelForCausalLM
    base.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert run(loaded, zh_broken, tok, suite).decision == NOGO  # no card: every language gates
    (tmp_path / "README.md").write_text(CARD_EN)
    r = run(loaded, zh_broken, tok, suite)
    assert r.decision == GO and r.meta["languages"] == {"gating": ["en"], "source": "model card"}
    assert r.verdict.not_gated == {"names-zh": "not gated (model card languages: en)"}
    assert run(loaded, zh_broken, tok, suite, languages="en,zh").decision == NOGO  # explicit wins


def test_reports_show_what_does_not_gate(base, tok, zh_broken, suite, tmp_path):
    r = run(base, zh_broken, tok, suite, languages="en")
    out = r.save(tmp_path / "eval")
    data = json.loads((out / "report.json").read_text())
    assert data["decision"] == GO and data["languages"] == {"numbers-en": "en", "names-zh": "zh"}
    assert data["verdict"]["reasons"] == [] and data["verdict"]["informational"]
    md = (out / "report.md").read_text()
    assert "## Not gated (information only)" in md and "## Reasons" not in md
    assert "| names-zh | zh | NO-GO | not gated (--languages: en) |" in md
    assert "| numbers-en | en | GO | yes |" in md
    page = parse((out / "report.html").read_text())
    rows = {row[0][0]: [t for t, _ in row[:4]] for row in page.tables["slices"][1:]}
    assert rows == {"numbers-en": ["numbers-en", "en", "GO", "yes"],
                    "names-zh": ["names-zh", "zh", "NO-GO", "not gated (--languages: en)"]}
    for i, reason in enumerate(data["verdict"]["informational"]):
        assert float(page.cells[f"verdict.informational.{i}.value"]) == reason["value"]


# --- from folders: card, recipe and option ----------------------------------------------

@pytest.fixture(scope="module")
def folders(base, tok, zh_broken, tmp_path_factory):
    root = tmp_path_factory.mktemp("lang")
    for name, model in (("base", base), ("cand", zh_broken)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "base" / "README.md").write_text(CARD_EN)
    return root


SECTION = {"suite": "numbers-en,names-zh", "max_len": 256, "thresholds": TINY_THRESHOLDS,
           "options": {k: v for k, v in OPTS.__dict__.items()} | {"text_items": 3}}


@pytest.mark.parametrize("option, recipe_langs, decision, source", [
    (None, None, GO, "model card"),
    (None, ["en", "zh"], NOGO, "eval.languages"),
    ("en", ["en", "zh"], GO, "--languages"),
    ("zh,en", None, NOGO, "--languages"),
])
def test_evaluate_paths_precedence(folders, option, recipe_langs, decision, source):
    section = {**SECTION, **({"languages": recipe_langs} if recipe_langs else {})}
    r = evaluate_paths(folders / "base", folders / "cand", eval_section=section, languages=option,
                       progress=False)
    assert (r.decision, r.meta["languages"]["source"]) == (decision, source)


def test_eval_command_languages_option(folders, tmp_path):
    import typer
    from typer.testing import CliRunner

    from quantkit.cli.eval_command import eval_command
    app = typer.Typer()
    app.command()(eval_command)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "scheme": "W8A16", "eval": SECTION}))
    args = ["--baseline", str(folders / "base"), "--candidate", str(folders / "cand"), "--recipe", str(recipe),
            "--out", str(tmp_path / "rep")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("GO") and "(information, not gated (model card languages: en)) NO-GO: names-zh" in r.stdout
    r = CliRunner().invoke(app, args + ["--languages", "en,zh", "--overwrite"])
    assert r.exit_code == 0 and r.stdout.startswith("NO-GO")
    r = CliRunner().invoke(app, args + ["--languages", "en,english", "--overwrite"])
    assert r.exit_code == 2 and "--languages: 'english' is not a language code" in r.stderr


# --- the model card travels -------------------------------------------------------------

def test_convert_carries_the_model_card(folders):
    """The checkpoint's own card keeps the base card's languages and terms, and its text below."""
    q = quantkit.quantize(str(folders / "base"), "w8a16")
    card = (q.path / "README.md").read_text()
    assert card.endswith("## The base model's card\n\nA tiny English test model.\n")
    assert "\nlicense: apache-2.0\n" in card.split("\n---\n", 1)[0]
    assert model_card_languages(q.path) == ("en",)


def test_default_model_folder_gets_its_card(tmp_path, monkeypatch):
    from quantkit.inputs import embedded_model as models
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    target = tmp_path / "smollm2-135m-instruct"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    assert models.default_model_dir() == target  # a cache made before the card existed
    assert model_card_languages(target) == ("en",)
    assert (target / "README.md").read_text().startswith("---\nlanguage:\n- en\nlicense: apache-2.0\n---\n")
    assert [p.name for p in target.iterdir() if p.name.startswith(".")] == []
