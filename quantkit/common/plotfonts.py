"""Plots labelled in the report's language: Chinese labels need a font with Chinese glyphs, which
matplotlib does not ship (its DejaVu Sans draws them as empty boxes).

``plot_language(lang)`` finds one among the fonts the system has (scripts/setup-browser.sh installs
WenQuanYi Zen Hei on Debian) and sets it after DejaVu Sans, so Latin text keeps its usual face and
Chinese falls through to the CJK font. Without such a font the plots are labelled in English, and
the caller says so beside them.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: families with Simplified Chinese glyphs, the most complete first
CJK_FAMILIES = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei",
                "Droid Sans Fallback", "SimHei", "Microsoft YaHei", "PingFang SC")
_CJK_FILES = ("notosanscjk", "sourcehansans", "wqy-zenhei", "wqy-microhei", "droidsansfallback")


def cjk_family() -> str | None:
    """The first of ``CJK_FAMILIES`` matplotlib can use, or None. A font installed after
    matplotlib built its font cache is not in it: such files are looked for and added."""
    from matplotlib import font_manager

    def known() -> str | None:
        names = {f.name for f in font_manager.fontManager.ttflist}
        return next((n for n in CJK_FAMILIES if n in names), None)

    found = known()
    if found is None:
        for path in font_manager.findSystemFonts():
            if any(key in Path(path).name.lower().replace("_", "") for key in _CJK_FILES):
                font_manager.fontManager.addfont(path)
        found = known()
    return found


@contextmanager
def plot_language(lang: str) -> Iterator[str]:
    """Within the block, matplotlib draws ``lang``'s text; yields the language the plots can be
    labelled in: ``lang``, or "en" where ``lang`` needs a font this machine lacks."""
    import matplotlib

    family = None if lang == "en" else cjk_family()
    if family is None:
        yield "en"
        return
    # a list of families in font.family itself is what matplotlib falls back through glyph by glyph;
    # CJK fonts often come in one weight (WenQuanYi Zen Hei: 500), and matplotlib logs a warning
    # for every text it draws in the nearest weight
    log = logging.getLogger("matplotlib.font_manager")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with matplotlib.rc_context({"font.family": ["DejaVu Sans", family], "axes.unicode_minus": False}):
            yield lang
    finally:
        log.setLevel(level)
