"""Language of a text by script: enough to report the zh/en mix of a log, not a classifier.

On the first 2,000 characters: ``zh`` when CJK ideographs are at least 20% of the letters,
``en`` when Latin letters are at least 80%, ``other`` for any other script mix, ``none`` when
there are no letters at all. Letters are counted by runs (one regex match per word, not per
character), which keeps this cheap on a 100k-row log.
"""

from __future__ import annotations

import re

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_LATIN = re.compile(r"[A-Za-z]+")
_OTHER = re.compile(r"[^\W\dA-Za-z_\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
SAMPLE_CHARS = 2000


def detect_language(text: str) -> str:
    head = text[:SAMPLE_CHARS]
    cjk = sum(map(len, _CJK.findall(head)))
    latin = sum(map(len, _LATIN.findall(head)))
    letters = cjk + latin + sum(map(len, _OTHER.findall(head)))
    if letters == 0:
        return "none"
    if cjk >= 0.2 * letters:
        return "zh"
    if latin >= 0.8 * letters:
        return "en"
    return "other"
