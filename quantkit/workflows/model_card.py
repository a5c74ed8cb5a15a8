"""The model card every converted checkpoint carries: ``README.md`` in the Hugging Face convention.

YAML front matter (``base_model``, ``library_name``, ``tags`` with ``compressed-tensors`` and the
scheme, and the base card's ``license`` and ``language``, which the evaluation's language gate
reads), then the recipe, how to load the checkpoint in vLLM and transformers, the calibration set
(its size and content hash, never its text), the footprint, the verdict once the evaluation has
run, and the base model's own card below. Everything is read from the checkpoint's own files, so
the card is the same bytes for the same checkpoint (a resumed run included) and is rendered again,
with the verdict, after the evaluation, in the language it was written in.

The words are English or Chinese (``quantkit convert --lang zh``), one ``README.md`` either way:
the hub shows only that file. The front matter is the same keys and values in both, as the hub
and the evaluation's language gate read it; the base card below is kept in its own language.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from quantkit.common import i18n
from quantkit.common.i18n import LANGUAGES
from quantkit.common.markdown_text import md_cell_code, md_code, md_row
from quantkit.config.safe_yaml import load_yaml_text
from quantkit.evaluation.report.gating import worst_per_slice
from quantkit.evaluation.report.markdown import reason_line

CARD = "README.md"
BASE_CARD_HEADING = "## The base model's card"
# The base card's front matter keys the quantized model keeps: its terms, and the languages the
# evaluation gates on.
CARRIED = ("license", "license_name", "license_link", "language")


@dataclass(frozen=True)
class CardFacts:
    """What the card says, read from the checkpoint's files."""

    base_model: str
    recipe: str
    groups: list[dict]
    ignore: list[str]
    kv_cache: dict | None
    shard_bytes: int
    shards: int
    calibration: dict
    base_front: dict = field(default_factory=dict)   # the base card's front matter
    base_body: str = ""
    verdict: dict | None = None
    lang: str = "en"                                  # the language of the card's words (TEXTS)
    # the class the snippet loads with: the causal-LM auto class, or a vision-language model's own
    model_class: str = "AutoModelForCausalLM"


def split_card(text: str) -> tuple[dict, str]:
    """``(front matter, body)`` of a model card; a card without front matter, or with front matter
    that is not a YAML mapping, has an empty one.

    >>> split_card("---\\nlanguage: [en]\\n---\\nHello\\n")
    ({'language': ['en']}, 'Hello\\n')
    >>> split_card("Just text")
    ({}, 'Just text')
    """
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---", 4)
    if end < 0:
        return {}, text
    try:
        front = load_yaml_text(text[4:end])
    except yaml.YAMLError:
        front = None
    body = text[end + 4:].lstrip("\n")
    return (front if isinstance(front, dict) else {}), body


def scheme_tag(group: dict) -> str:
    """``w4a16``, ``w8a8``, ``fp8`` (float weights and activations) for a config group.

    >>> scheme_tag({"weights": {"num_bits": 4, "type": "int"}, "input_activations": None})
    'w4a16'
    >>> scheme_tag({"weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}})
    'fp8'
    """
    w, a = group.get("weights") or {}, group.get("input_activations") or {}
    if w.get("type") == "float" and a.get("type") == "float":
        return f"fp{w.get('num_bits')}"
    return f"w{w.get('num_bits')}a{a.get('num_bits', 16)}"


def front_matter(f: CardFacts) -> dict:
    tags = ["compressed-tensors", "quantkit"]
    tags += sorted({scheme_tag(g) for g in f.groups}) + sorted({g.get("format") for g in f.groups if g.get("format")})
    front: dict[str, Any] = {"base_model": f.base_model, "library_name": "transformers", "tags": tags}
    front.update({k: f.base_front[k] for k in CARRIED if k in f.base_front})
    if "pipeline_tag" in f.base_front:
        front["pipeline_tag"] = f.base_front["pipeline_tag"]
    return front


@dataclass(frozen=True)
class CardText:
    """The card's words in one language: headings, table labels and sentences, with ``str.format``
    fields. Only the words change with the language; the front matter, the commands and the
    figures are the same in every card."""

    title: str                 # base, recipe
    intro: str                 # base, recipe
    labels: dict[str, str]     # the table's first column, by row
    nothing: str
    weights: str               # targets, bits, type, sym, per, size, acts
    group_size: str            # n
    symmetric: tuple[str, str]  # symmetric, asymmetric
    acts16: str
    acts: str                  # bits, type, mode, per
    modes: tuple[str, str]     # dynamic, static
    per: str                   # {} the strategy, where ``strategies`` has no phrase for it
    kv: str                    # bits, type, per
    size: str                  # mib, shards, plural
    calibration: str           # n, tokens, what
    calibration_file: str      # name, format, sha
    calibration_passed: str
    calibration_none: str
    use: str
    needs_ct: str
    evaluation: str
    verdict: str               # decision
    verdict_head: str
    not_gated: str             # level: a slice measured but not gating the decision
    not_evaluated: str
    base_card: str
    strategies: dict[str, str] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    sep: str = ", "


TEXTS: dict[str, CardText] = {
    "en": CardText(
        title="# {base}, quantized by quantkit ({recipe})",
        intro="A [compressed-tensors](https://github.com/neuralmagic/compressed-tensors) checkpoint of {base}, "
              "written by {command}.",
        labels={"recipe": "Recipe", "quantized": "Quantized", "kept": "Kept in high precision", "kv": "KV cache",
                "size": "Size on disk", "calibration": "Calibration"},
        nothing="nothing", weights="{targets}: {bits}-bit {type} weights, {sym}, {per}{size}; {acts}",
        group_size=", group size {n}", symmetric=("symmetric", "asymmetric"), acts16="16-bit activations",
        acts="{bits}-bit {type} activations, {mode} {per}", modes=("dynamic", "static"), per="per {}",
        kv="{bits}-bit {type}, {per}", size="{mib:.1f} MiB in {shards} shard{plural}",
        calibration="{n} samples, {tokens} tokens {what}; its text is not in this card",
        calibration_file="from `{name}` ({format}, sha256 `{sha}`)", calibration_passed="from samples passed in",
        calibration_none="none: the recipe needs no calibration data", use="## Use it",
        needs_ct="needs compressed-tensors", evaluation="## Evaluation",
        verdict="Verdict of `quantkit eval` on this checkpoint against its base model: **{decision}** "
                "(`eval/report.html`).",
        verdict_head="| slice | level | first reason |", not_gated="{level}, not gated",
        not_evaluated="Not evaluated yet: `quantkit eval --candidate ./this-folder --baseline BASE_MODEL_FOLDER`.",
        base_card=BASE_CARD_HEADING),
    "zh": CardText(
        title="# {base}：quantkit 量化版（{recipe}）",
        intro="{base} 的 [compressed-tensors](https://github.com/neuralmagic/compressed-tensors) 格式 "
              "checkpoint，由 {command} 生成。",
        labels={"recipe": "配方", "quantized": "已量化", "kept": "保持原精度", "kv": "KV cache",
                "size": "磁盘占用", "calibration": "校准数据"},
        nothing="无", weights="{targets}：{bits} 位{type}权重，{sym}，{per}{size}；{acts}",
        group_size="，组大小 {n}", symmetric=("对称", "非对称"), acts16="激活保持 16 位",
        acts="激活为 {bits} 位{type}（{mode}，{per}）", modes=("动态", "静态"), per="按 {}",
        kv="{bits} 位{type}，{per}", size="{mib:.1f} MiB，共 {shards} 个分片",
        calibration="{n} 条样本，共 {tokens} 个 token，{what}；本模型卡不含校准文本",
        calibration_file="来自 `{name}`（{format}，sha256 `{sha}`）", calibration_passed="由调用方直接传入的样本",
        calibration_none="无：该配方不需要校准数据", use="## 使用方法",
        needs_ct="需要安装 compressed-tensors", evaluation="## 评估结果",
        verdict="`quantkit eval` 将本 checkpoint 与其基础模型对比，结论为 **{decision}**（详见 `eval/report.html`）。",
        verdict_head="| 切片 | 级别 | 首要原因 |", not_gated="{level}，不参与判定",
        not_evaluated="尚未评估。评估命令：`quantkit eval --candidate ./this-folder --baseline BASE_MODEL_FOLDER`。",
        base_card="## 基础模型的模型卡",
        strategies={"tensor": "按张量", "channel": "按通道", "group": "按组", "token": "按 token",
                    "attn_head": "按注意力头", "block": "按块", "tensor_group": "按张量组"},
        types={"int": "整数", "float": "浮点"}, sep="、"),
}
assert tuple(TEXTS) == LANGUAGES, "a model card in every report language"


def check_lang(lang: object, name: str = "--lang") -> str:
    """``lang`` when the card (and the reports) can be written in it, else a one-line error naming ``name``.

    >>> check_lang("zh")
    'zh'
    >>> check_lang("fr")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: --lang: expected one of en, zh, got 'fr'
    """
    return i18n.check_lang(lang, name)


def _per(t: CardText, strategy: object) -> str:
    return t.strategies.get(str(strategy)) or t.per.format(strategy)


def _weights_line(t: CardText, group: dict) -> str:
    w, a = group.get("weights") or {}, group.get("input_activations")
    size = t.group_size.format(n=w["group_size"]) if w.get("group_size") else ""
    sym = t.symmetric[0 if w.get("symmetric", True) else 1]
    acts = t.acts16 if not a else t.acts.format(
        bits=a.get("num_bits"), type=t.types.get(a.get("type"), a.get("type")),
        mode=t.modes[0 if a.get("dynamic") else 1], per=_per(t, a.get("strategy")))
    return t.weights.format(targets=t.sep.join(md_cell_code(x) for x in group.get("targets", [])), bits=w.get("num_bits"),
                            type=t.types.get(w.get("type"), w.get("type")), sym=sym,
                            per=_per(t, w.get("strategy")), size=size, acts=acts)


def _worst_first(reasons: list[dict]) -> list[dict]:
    """Each slice's reasons, its worst first (the report's order), where they carry their figures."""
    if not all(k in r for r in reasons for k in ("measure", "value", "limit", "level")):
        return reasons
    return [reasons[i] for group in worst_per_slice(reasons) for i in group]


def _verdict_lines(t: CardText, verdict: dict, lang: str) -> list[str]:
    """The decision, then a row per slice: its level and its first reason; a slice that does not
    gate (the evaluation's language gate) says so beside its would-be level, its first reason the
    one that would have counted. A slice's first reason is its worst, as the report's first screen
    shows it."""
    reasons: dict[str, str] = {}
    for r in _worst_first(verdict.get("reasons", []) + verdict.get("informational", [])):
        whole = all(k in r for k in ("measure", "value", "limit", "level"))
        reasons.setdefault(r["slice"], reason_line(r, lang) if whole else r["text"])
    off = verdict.get("not_gated") or {}
    lines = [t.verdict.format(decision=verdict["decision"]), "", t.verdict_head, "|---|---|---|"]
    for name, level in verdict.get("slices", {}).items():
        shown = t.not_gated.format(level=level) if name in off else level
        lines.append(md_row([name, shown, reasons.get(name, "")]))
    return lines


def _calibration_value(t: CardText, cal: dict) -> str:
    if not cal.get("num_samples"):
        return t.calibration_none
    source = cal.get("source") or {}
    what = t.calibration_file.format(name=source.get("name"), format=source.get("format"),
                                     sha=str(source.get("sha256"))[:16]) if source else t.calibration_passed
    return t.calibration.format(n=cal.get("num_samples"), tokens=cal.get("num_tokens"), what=what)


def _facts_table(t: CardText, f: CardFacts) -> list[str]:
    label = t.labels
    lines = ["| | |", "|---|---|", f"| {label['recipe']} | {md_cell_code(f.recipe)} |"]
    lines += [f"| {label['quantized']} | {_weights_line(t, g)} |" for g in f.groups]
    lines.append(f"| {label['kept']} | {', '.join(md_cell_code(i) for i in f.ignore) or t.nothing} |")
    if f.kv_cache:
        kv = f.kv_cache
        lines.append(f"| {label['kv']} | " + t.kv.format(bits=kv.get("num_bits"), type=t.types.get(kv.get("type"), kv.get("type")),
                                                        per=_per(t, kv.get("strategy"))) + " |")
    size = t.size.format(mib=f.shard_bytes / 2**20, shards=f.shards, plural="s" if f.shards != 1 else "")
    lines.append(f"| {label['size']} | {size} |")
    lines.append(f"| {label['calibration']} | {_calibration_value(t, f.calibration)} |")
    return lines


def render(f: CardFacts) -> str:
    """The card's text, in ``f.lang``: deterministic for the same facts."""
    t = TEXTS[f.lang]
    # the names come from the user's folders and recipes: code spans, never markup (a heading, HTML, a link)
    base, command = md_code(f.base_model), md_code(f"quantkit convert --recipe {f.recipe}")
    lines = [t.title.format(base=base, recipe=md_code(f.recipe)), "", t.intro.format(base=base, command=command), ""]
    lines += _facts_table(t, f)
    lines += ["", t.use, "", "```bash", "vllm serve ./this-folder", "```", "",
              "```python", f"from transformers import {f.model_class}",
              f'model = {f.model_class}.from_pretrained("./this-folder")  # {t.needs_ct}',
              "```", "", t.evaluation, ""]
    lines += _verdict_lines(t, f.verdict, f.lang) if f.verdict else [t.not_evaluated]
    if f.base_body.strip():
        lines += ["", t.base_card, "", f.base_body.rstrip()]
    head = yaml.safe_dump(front_matter(f), sort_keys=False, allow_unicode=True)
    return f"---\n{head}---\n" + "\n".join(lines) + "\n"


def own_card_parts(body: str) -> tuple[str, str]:
    """``(language, base card body)`` of a card quantkit rendered: the language whose "use it"
    heading comes first (the base card below may hold any heading), and what follows that
    language's base-card heading.

    >>> own_card_parts("# m\\n\\n## 使用方法\\n\\n...\\n## 基础模型的模型卡\\n\\nBase.\\n")
    ('zh', 'Base.\\n')
    """
    found = sorted((body.find(f"\n{t.use}\n"), lang) for lang, t in TEXTS.items() if f"\n{t.use}\n" in body)
    lang = found[0][1] if found else "en"
    heading = TEXTS[lang].base_card
    return lang, (body.split(heading, 1)[1].lstrip("\n") if heading in body else "")


def card_facts(folder: Path, base_model: str | None = None, lang: str | None = None) -> CardFacts:
    """The facts of the checkpoint in ``folder``; its ``README.md`` is the base model's card (just
    copied) or a card rendered before, whose base card part, ``base_model`` and language are kept
    (``lang`` None)."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    qc = config.get("quantization_config") or {}
    log = json.loads((folder / "quantization_log.json").read_text(encoding="utf-8"))
    # the base card is the user's text: undecodable bytes become U+FFFD rather than failing the run
    text = (folder / CARD).read_text(encoding="utf-8", errors="replace") if (folder / CARD).is_file() else ""
    front, body = split_card(text)
    earlier = "en"
    if front.get("library_name") == "transformers" and "quantkit" in (front.get("tags") or []):   # ours
        base_model = base_model or str(front.get("base_model"))
        earlier, body = own_card_parts(body)
    report = folder / "eval" / "report.json"
    data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    verdict = data.get("verdict") or ({"decision": data["decision"]} if "decision" in data else None)
    shards = sorted(folder.glob("*.safetensors"))
    return CardFacts(base_model=base_model or folder.name, recipe=str(log.get("recipe", {}).get("name", "custom")),
                     groups=list((qc.get("config_groups") or {}).values()), ignore=list(qc.get("ignore") or []),
                     kv_cache=qc.get("kv_cache_scheme"), shard_bytes=sum(p.stat().st_size for p in shards),
                     shards=len(shards), calibration=log.get("calibration") or {}, base_front=front,
                     base_body=body, verdict=verdict, lang=check_lang(lang or earlier, "lang"),
                     model_class=loading_class(config))


def loading_class(config: dict) -> str:
    """The transformers class a user loads the checkpoint with: ``AutoModelForCausalLM`` for a
    causal LM, else the class its ``architectures`` names (``Qwen2_5_VLForConditionalGeneration``),
    which the causal-LM auto class does not build."""
    import transformers

    name = next(iter(config.get("architectures") or []), "")
    if name.endswith("ForCausalLM") or not name.isidentifier() or not hasattr(transformers, name):
        return "AutoModelForCausalLM"
    return name


def write_card(folder: Path, base_model: str | None = None, lang: str | None = None) -> Path:
    """Render ``folder``'s card and put it in place in one rename: a reader never sees half of it.
    ``base_model`` None: the one an earlier card of this checkpoint names; ``lang`` (``en``,
    ``zh``) None: the language of an earlier card of this checkpoint, else English."""
    path = Path(folder) / CARD
    text = render(card_facts(Path(folder), base_model, lang))
    tmp = path.with_name(f".{CARD}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)   # a failed write (a full disk) leaves no half card behind
    return path
