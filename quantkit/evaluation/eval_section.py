"""The ``eval:`` section of a recipe, checked when the recipe loads (a typo fails before a
conversion starts, not after it)::

    eval:
      suite: default            # or a comma list of slice names, or a folder of .jsonl slices
      max_len: 4096
      languages: [en]           # the languages whose slices gate the verdict (languages.py)
      thresholds: {kl_mean: {review: 0.01, nogo: 0.05}}   # verdict.py
      options: {text_items: 12}                           # SuiteOptions
      show_samples: false

The core never imports this package: the entry points that load a recipe pass the checker,
``load_recipe(path, check_eval=check_eval_section)`` (``quantkit convert``, ``quantkit eval``).
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from quantkit.config.validation import build_options, config, parse
from quantkit.evaluation.languages import parse_languages
from quantkit.evaluation.verdict import Thresholds
from quantkit.evaluation.slices import SuiteOptions


@config
class EvalSection:
    """The section's keys and types; the values below are checked by their own readers."""

    suite: StrictStr | None = None
    max_len: Annotated[StrictInt, Field(ge=16)] | None = None
    show_samples: StrictBool = False
    languages: Any = None                              # "en,zh" or [en, zh]: parse_languages
    thresholds: dict[StrictStr, Any] | None = None     # measure -> {review, nogo}: Thresholds
    options: dict[StrictStr, Any] | None = None        # SuiteOptions fields


def check_eval_section(section, where: str = "eval") -> dict:
    """The section as a dict, or a ``QuantkitError`` naming the first bad key."""

    parse(EvalSection, {} if section is None else section, where)
    section = dict(section or {})
    Thresholds.from_dict(section.get("thresholds"), f"{where}.thresholds")
    if section.get("languages") is not None:
        parse_languages(section["languages"], f"{where}.languages")
    suite_options(section, where)
    return section


def suite_options(section: dict, where: str = "eval"):
    """``SuiteOptions`` from the section's ``options`` (unknown keys and wrong types refused)."""

    return build_options(SuiteOptions, section.get("options"), f"{where}.options")
