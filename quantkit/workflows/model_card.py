"""The model card every converted checkpoint carries: ``README.md`` in the Hugging Face convention.

YAML front matter (``base_model``, ``library_name``, ``tags`` with ``compressed-tensors`` and the
scheme, and the base card's ``license`` and ``language``, which the evaluation's language gate
reads), then the recipe, how to load the checkpoint in vLLM and transformers, the calibration set
(its size and content hash, never its text), the footprint, the verdict once the evaluation has
run, and the base model's own card below. Everything is read from the checkpoint's own files, so
the card is the same bytes for the same checkpoint (a resumed run included) and is rendered again,
with the verdict, after the evaluation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from quantkit.config.safe_yaml import load_yaml_text

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


def _weights_line(group: dict) -> str:
    w, a = group.get("weights") or {}, group.get("input_activations")
    size = f", group size {w['group_size']}" if w.get("group_size") else ""
    sym = "symmetric" if w.get("symmetric", True) else "asymmetric"
    acts = "16-bit activations" if not a else (
        f"{a.get('num_bits')}-bit {a.get('type')} activations, {'dynamic' if a.get('dynamic') else 'static'} "
        f"per {a.get('strategy')}")
    return (f"{', '.join(group.get('targets', []))}: {w.get('num_bits')}-bit {w.get('type')} weights, {sym}, "
            f"per {w.get('strategy')}{size}; {acts}")


def _verdict_lines(verdict: dict) -> list[str]:
    reasons: dict[str, str] = {}
    for r in verdict.get("reasons", []):
        reasons.setdefault(r["slice"], r["text"])
    lines = [f"Verdict of `quantkit eval` on this checkpoint against its base model: **{verdict['decision']}** "
             "(`eval/report.html`).", "", "| slice | level | first reason |", "|---|---|---|"]
    for name, level in verdict.get("slices", {}).items():
        lines.append(f"| {name} | {level} | {reasons.get(name, '').replace('|', '/')} |")
    return lines


def render(f: CardFacts) -> str:
    """The card's text: deterministic for the same facts."""
    mib = f.shard_bytes / 2**20
    cal = f.calibration
    source = cal.get("source") or {}
    lines = [f"# {f.base_model}, quantized by quantkit ({f.recipe})", "",
             f"A [compressed-tensors](https://github.com/neuralmagic/compressed-tensors) checkpoint of "
             f"`{f.base_model}`, written by `quantkit convert --recipe {f.recipe}`.", "",
             "| | |", "|---|---|", f"| Recipe | `{f.recipe}` |"]
    lines += [f"| Quantized | {_weights_line(g)} |" for g in f.groups]
    lines.append(f"| Kept in high precision | {', '.join(f'`{i}`' for i in f.ignore) or 'nothing'} |")
    if f.kv_cache:
        lines.append(f"| KV cache | {f.kv_cache.get('num_bits')}-bit {f.kv_cache.get('type')}, "
                     f"per {f.kv_cache.get('strategy')} |")
    lines.append(f"| Size on disk | {mib:.1f} MiB in {f.shards} shard{'s' if f.shards != 1 else ''} |")
    if cal.get("num_samples"):
        what = f"`{source.get('name')}` ({source.get('format')}, sha256 `{str(source.get('sha256'))[:16]}`)" \
            if source else "samples passed in"
        lines.append(f"| Calibration | {cal.get('num_samples')} samples, {cal.get('num_tokens')} tokens from "
                     f"{what}; its text is not in this card |")
    else:
        lines.append("| Calibration | none: the recipe needs no calibration data |")
    lines += ["", "## Use it", "", "```bash", "vllm serve ./this-folder", "```", "",
              "```python", "from transformers import AutoModelForCausalLM",
              'model = AutoModelForCausalLM.from_pretrained("./this-folder")  # needs compressed-tensors',
              "```", "", "## Evaluation", ""]
    lines += _verdict_lines(f.verdict) if f.verdict else [
        "Not evaluated yet: `quantkit eval --candidate ./this-folder --baseline BASE_MODEL_FOLDER`."]
    if f.base_body.strip():
        lines += ["", BASE_CARD_HEADING, "", f.base_body.rstrip()]
    head = yaml.safe_dump(front_matter(f), sort_keys=False, allow_unicode=True)
    return f"---\n{head}---\n" + "\n".join(lines) + "\n"


def card_facts(folder: Path, base_model: str | None = None) -> CardFacts:
    """The facts of the checkpoint in ``folder``; its ``README.md`` is the base model's card (just
    copied) or a card rendered before, whose base card part and ``base_model`` are kept."""
    qc = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("quantization_config") or {}
    log = json.loads((folder / "quantization_log.json").read_text(encoding="utf-8"))
    # the base card is the user's text: undecodable bytes become U+FFFD rather than failing the run
    text = (folder / CARD).read_text(encoding="utf-8", errors="replace") if (folder / CARD).is_file() else ""
    front, body = split_card(text)
    if front.get("library_name") == "transformers" and "quantkit" in (front.get("tags") or []):   # ours
        base_model = base_model or str(front.get("base_model"))
        body = body.split(BASE_CARD_HEADING, 1)[1].lstrip("\n") if BASE_CARD_HEADING in body else ""
    report = folder / "eval" / "report.json"
    data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    verdict = data.get("verdict") or ({"decision": data["decision"]} if "decision" in data else None)
    shards = sorted(folder.glob("*.safetensors"))
    return CardFacts(base_model=base_model or folder.name, recipe=str(log.get("recipe", {}).get("name", "custom")),
                     groups=list((qc.get("config_groups") or {}).values()), ignore=list(qc.get("ignore") or []),
                     kv_cache=qc.get("kv_cache_scheme"), shard_bytes=sum(p.stat().st_size for p in shards),
                     shards=len(shards), calibration=log.get("calibration") or {}, base_front=front,
                     base_body=body, verdict=verdict)


def write_card(folder: Path, base_model: str | None = None) -> Path:
    """Render ``folder``'s card and put it in place in one rename: a reader never sees half of it.
    ``base_model`` None: the one an earlier card of this checkpoint names."""
    path = Path(folder) / CARD
    text = render(card_facts(Path(folder), base_model))
    tmp = path.with_name(f".{CARD}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)   # a failed write (a full disk) leaves no half card behind
    return path
