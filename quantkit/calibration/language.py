"""Language of a text by script: enough to report the zh/en mix of a log, not a classifier.

``zh`` when CJK ideographs are at least 20% of the letters, ``en`` when Latin letters are at
least 80%, ``other`` for any other script mix, ``none`` when there are no letters at all.
"""

from __future__ import annotations

import re

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")
_LETTER = re.compile(r"[^\W\d_]")
SAMPLE_CHARS = 4000


def detect_language(text: str) -> str:
    head = text[:SAMPLE_CHARS]
    letters = len(_LETTER.findall(head))
    if letters == 0:
        return "none"
    if len(_CJK.findall(head)) >= 0.2 * letters:
        return "zh"
    if len(_LATIN.findall(head)) >= 0.8 * letters:
        return "en"
    return "other"
