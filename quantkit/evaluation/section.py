"""The ``eval:`` section of a recipe, checked when the recipe loads (a typo fails before a
conversion starts, not after it)::

    eval:
      suite: default            # or a comma list of slice names, or a folder of .jsonl slices
      max_len: 4096
      languages: [en]           # the languages whose slices gate the verdict (languages.py)
      thresholds: {kl_mean: {review: 0.01, nogo: 0.05}}   # verdict.py
      options: {text_items: 12}                           # SuiteOptions
      show_samples: false
"""
from __future__ import annotations

from ..errors import QuantkitError

EVAL_KEYS = {"thresholds", "suite", "max_len", "show_samples", "options", "languages"}


def check_eval_section(section, where: str = "eval") -> dict:
    """The section as a dict, or a ``QuantkitError`` naming the first bad key."""
    from .languages import parse_languages
    from .verdict import Thresholds

    section = dict(section or {})
    unknown = sorted(set(section) - EVAL_KEYS)
    if unknown:
        raise QuantkitError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(EVAL_KEYS))})")
    Thresholds.from_dict(section.get("thresholds"), f"{where}.thresholds")
    if section.get("languages") is not None:
        parse_languages(section["languages"], f"{where}.languages")
    suite_options(section, where)
    max_len = section.get("max_len")
    if max_len is not None and (not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 16):
        raise QuantkitError(f"{where}.max_len: expected an integer >= 16, got {max_len!r}")
    return section


def suite_options(section: dict, where: str = "eval"):
    """``SuiteOptions`` from the section's ``options`` (unknown keys and non-integers refused)."""
    from ..recipe import _section
    from .slices import SuiteOptions

    return _section(SuiteOptions, section.get("options"), f"{where}.options")
