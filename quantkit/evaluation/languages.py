"""Which slices gate the verdict: the languages the model is for.

A slice's language is its items' ``language`` key when they all agree, else its name's
suffix (``numbers-zh`` -> ``zh``); business slices (the user's calibration log) and slices
with no language always gate.

The languages that gate, in order of precedence:

1. an explicit list: ``quantkit eval --languages en,zh`` (or ``eval: languages: [en, zh]`` in a
   recipe, which the option overrides);
2. the ``language:`` list in the YAML front matter of the baseline folder's ``README.md``
   (its Hugging Face model card);
3. every language (all slices gate).

Slices in other languages are still measured and shown everywhere with their would-be
level, marked "not gated (model card languages: en)"; their breaches are listed apart as
information and never change the decision. A model card that lists ``multilingual`` gates
every language.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
import yaml
from quantkit.config.safe_yaml import MAX_YAML_BYTES, load_yaml_text

_CODE = re.compile(r"^[a-z]{2,3}$")
_FRONT_MATTER = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
_SUFFIX = re.compile(r"-([a-z]{2,3})$")


def normalise(code: str) -> str:
    """``"zh-CN"`` / ``"zh_Hans"`` -> ``"zh"``: the primary subtag, lower case."""
    return code.strip().lower().replace("_", "-").split("-")[0]


def slice_language(name: str, items: list[dict]) -> str | None:
    """``language`` of the items if they all agree, else the name's suffix, else None."""
    langs = {normalise(str(it["language"])) for it in items if it.get("language")}
    if len(langs) == 1 and len([it for it in items if it.get("language")]) == len(items):
        return langs.pop()
    m = _SUFFIX.search(name)
    return m.group(1) if m else None


def parse_languages(value, where: str) -> tuple[str, ...]:
    """``"en,zh"`` or ``["en", "zh"]`` -> ``("en", "zh")``; anything else is a user error."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise QuantkitError(f"{where}: expected a list of language codes, e.g. [en, zh]")
    codes = tuple(dict.fromkeys(normalise(p) for p in parts if p.strip()))
    if not codes:
        raise QuantkitError(f"{where}: expected at least one language code, e.g. en")
    bad = [c for c in codes if not _CODE.match(c)]
    if bad:
        raise QuantkitError(f"{where}: {bad[0]!r} is not a language code (ISO 639, e.g. en, zh)")
    return codes


def model_card_languages(folder: str | Path | None) -> tuple[str, ...] | None:
    """The ``language:`` of ``folder/README.md``'s YAML front matter; None when there is no
    card, no front matter, no usable ``language:`` or it says ``multilingual``."""


    if folder is None:
        return None
    card = Path(folder) / "README.md"
    if not card.is_file():
        return None
    try:
        with open(card, "rb") as fh:
            head = fh.read(MAX_YAML_BYTES)   # the front matter comes first; a card's prose may be long
        # the front matter as the Hub reads it (huggingface_hub's repocard.REGEX_YAML_BLOCK), parsed
        # under safe_yaml's limits: an alias bomb in a card is an unreadable card, not a hang
        match = _FRONT_MATTER.search(head.decode("utf-8", errors="replace"))
        meta = load_yaml_text(match.group(2)) if match else None
    except (ValueError, OSError, RecursionError, yaml.YAMLError):
        return None
    langs = meta.get("language") if isinstance(meta, dict) else None
    if isinstance(langs, str):
        langs = [langs]
    if not isinstance(langs, list):
        return None
    codes = tuple(dict.fromkeys(normalise(x) for x in langs if isinstance(x, str) and x.strip()))
    if not codes or "multilingual" in codes:
        return None
    return codes


@dataclass(frozen=True)
class LanguageGate:
    """The languages whose slices gate the verdict (None: all) and where that came from."""
    languages: tuple[str, ...] | None = None
    source: str = "every language"   # "--languages", "eval.languages", "model card", "every language"

    def gates(self, language: str | None, public: bool = True) -> bool:
        return not public or language is None or self.languages is None or language in self.languages

    def why_not(self) -> str:
        label = "model card languages" if self.source == "model card" else self.source
        return f"not gated ({label}: {', '.join(self.languages or ())})"

    def to_dict(self) -> dict:
        return {"gating": list(self.languages) if self.languages else None, "source": self.source}


def language_gate(explicit=None, model_dir: str | Path | None = None,
                  explicit_source: str = "--languages") -> LanguageGate:
    """Explicit languages, else the model card's, else every language.

    >>> language_gate("en,zh").languages, language_gate(None, None).languages
    (('en', 'zh'), None)
    """
    if isinstance(explicit, LanguageGate):
        return explicit
    if explicit:
        return LanguageGate(parse_languages(explicit, explicit_source), explicit_source)
    card = model_card_languages(model_dir)
    if card:
        return LanguageGate(card, "model card")
    return LanguageGate()


def model_folder(model) -> Path | None:
    """The folder an in-memory transformers model was loaded from, if it still exists."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    if name and Path(str(name)).is_dir():
        return Path(str(name))
    return None
