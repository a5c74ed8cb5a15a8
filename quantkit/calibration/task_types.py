"""Task types: taken from the log's task field when present, otherwise inferred by rules.

The rules read the instruction (system + user turns, or the prompt). "The ask" is the whole
instruction when it is short, else its first and last 400 characters: that is where a request
sits around an attached document, and a document's own words ("翻译" in a translated manual's
header, "summary" in a reference page) must not decide the task. First match wins:

1. ``translation``    the ask says "translate", "translation of/into", "into English/Chinese/...",
                      翻译成/翻译为/请翻译/翻译下面, 译成/译为 (not a bare "翻译": a translated
                      manual credits its translator with it)
2. ``summarisation``  the ask says "summarise/summarize/summary", "tl;dr", "key points", 总结,
                      摘要, 概括, 归纳
3. ``extraction``     the ask says "extract", "list all", "find all", "named entities", 提取,
                      抽取, 找出所有, 列出所有
4. ``classification`` the ask says "classify", "categorise", "sentiment", "positive or negative",
                      "which category/label", 分类, 情感, 正面还是负面, 类别
5. ``code``           a fenced code block anywhere, or the ask says "write/fix/debug/refactor ...
                      function/code/script", 写函数/写代码, 这段代码
6. ``qa_document``    a chat/prompt instruction with a document attached (>= 1,500 characters,
                      CJK characters counting 3) whose ask asks something ("?", what/who/how/...,
                      根据, 是什么, 为什么, 哪)
7. ``code``           >= 3 code-shaped lines (def/class/import/#include/function/return/...)
8. ``math``           "calculate/compute/solve/equation/how many/probability/value of/remainder/
                      divisible/...", 计算, 求解, 方程, math notation (``x = 3``, ``x^2``,
                      ``\\frac``, ``$...$``), a question with >= 3 numbers that are not years, or
                      digit-dense text with arithmetic (``12 * 7``)
9. ``chat``           any other chat or prompt row; raw-text rows fall back to ``text``.

Labels from a task field are the user's and stay the user's in the samples, the manifest and
the report (``user_labels``): rows group by the label's spelling-insensitive key (case, spaces,
dashes), shown in its most frequent spelling. Two labels are never merged, whatever they mean.
``TASK_ALIASES`` is internal: it only lets a row without a label, whose task the rules infer,
join the user's label for that task (an inferred ``summarisation`` row joins ``summarize``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

TASK_TYPES = ("translation", "summarisation", "extraction", "classification", "code",
              "qa_document", "math", "chat", "text")

TASK_ALIASES = {
    "summarization": "summarisation", "summary": "summarisation", "summarize": "summarisation",
    "translate": "translation", "classify": "classification", "extract": "extraction",
    "information_extraction": "extraction", "coding": "code", "programming": "code",
    "qa": "qa_document", "document_qa": "qa_document", "rag": "qa_document",
    "mathematics": "math", "arithmetic": "math", "conversation": "chat", "dialogue": "chat",
}

INSPECT_CHARS = 4000  # content rules look at the head and tail of long instructions only (speed)
DOCUMENT_CHARS = 1500
ASK_CHARS = 400  # where the question around an attached document is looked for (head or tail)

_I = re.IGNORECASE
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("translation", re.compile(
        r"\btranslate\b|\btranslation (of|into|to)\b"
        r"|\binto (english|chinese|french|german|spanish|japanese|korean)\b"
        r"|翻译成|翻译为|译成|译为|请翻译|翻译(一下|下面|以下|这段)|英译中|中译英", _I)),
    ("summarisation", re.compile(
        r"\bsummar(y|ies|ise|ize|ised|ized|isation|ization)\b|\btl;?dr\b|\bkey points\b"
        r"|总结|摘要|概括|归纳", _I)),
    ("extraction", re.compile(
        r"\bextract(ion)?\b|\blist (all|every)\b|\bfind all\b|\bnamed entit|\bpull out\b"
        r"|提取|抽取|找出(所有|全部|文中)|列出(所有|全部|文中)", _I)),
    ("classification", re.compile(
        r"\bclassif(y|ied|ication)\b|\bcategori[sz]e\b|\bsentiment\b|\bpositive or negative\b"
        r"|\bwhich (category|class|label)\b|分类|情感|正面还是负面|类别", _I)),
)
_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import |#include|public |private |function |const |let "
    r"|var |return\b|if \(|for \(|}\s*$|@\w+)", re.MULTILINE)
_CODE_ASK = re.compile(
    r"\b(write|implement|debug|fix|refactor|optimi[sz]e)\b.{0,40}?\b(function|code|script|class|"
    r"program|query|regex)\b|写(一个|一段)?(函数|程序|代码|脚本)|(这段|以下|下面的?)代码", _I)
_QUESTION = re.compile(r"[?？]|\b(what|who|when|where|why|how|which)\b|根据|是什么|为什么|哪", _I)
_MATH_ASK = re.compile(
    r"\b(calculate|compute|solve|equations?|how many|how much|probability|percentage|integral|"
    r"derivative|value of|remainder|divisible|polynomial|integers?|prime|ratio|variance)\b"
    r"|计算|求解|方程", _I)
_MATH_NOTATION = re.compile(r"\\frac|\$[^$\n]{1,80}\$|\b[a-z]\s*[=<>≤≥]\s*-?\d|\b[a-z]\^\d|\^\{")
_ARITHMETIC = re.compile(r"\d\s*[-+*/×÷^=]\s*\d")
_DIGITS = re.compile(r"\d+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_YEAR = re.compile(r"1[89]\d\d|20\d\d")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+")


def task_key(label: str) -> str:
    """Spelling-insensitive key of a label: ``"Chit Chat"`` and ``"chit-chat"`` are one task."""
    return label.strip().lower().replace(" ", "_").replace("-", "_")


def user_labels(given: Sequence[str | None], inferred: Sequence[str | None]) -> list[str]:
    """The task label of each row: its own (``given``), else the rules' (``inferred``), named by
    the user's label for that task when the log has one.

    >>> user_labels(["summarize", "Summarize", "summarize", None, None],
    ...             [None, None, None, "summarisation", "math"])
    ['summarize', 'summarize', 'summarize', 'summarize', 'math']
    """
    spellings: dict[str, Counter] = {}
    for label in given:
        if label is not None:
            spellings.setdefault(task_key(label), Counter())[label.strip()] += 1
    # Counter.most_common keeps first-seen order among ties: deterministic for one log
    shown = {key: c.most_common(1)[0][0] for key, c in spellings.items()}
    by_rule: dict[str, str] = {}
    for key in sorted(shown, key=lambda k: (-sum(spellings[k].values()), k)):
        by_rule.setdefault(TASK_ALIASES.get(key, key), shown[key])
    return [shown[task_key(g)] if g is not None else by_rule.get(r, r) for g, r in zip(given, inferred)]


def infer_task(instruction: str, shape: str) -> str:
    """The task type of one row by the rules above (see the module docstring)."""
    long = _weighted_len(instruction) >= DOCUMENT_CHARS
    ask = instruction[:ASK_CHARS] + "\n" + instruction[-ASK_CHARS:] if long else instruction
    for task, pattern in RULES:
        if pattern.search(ask):
            return task
    text = instruction if len(instruction) <= INSPECT_CHARS else \
        instruction[: INSPECT_CHARS // 2] + "\n" + instruction[-INSPECT_CHARS // 2:]
    if "```" in text or _CODE_ASK.search(ask):
        return "code"
    if long and shape != "text" and _QUESTION.search(ask):
        return "qa_document"
    if _at_least(_CODE_LINE.finditer(text), 3):
        return "code"
    if _MATH_ASK.search(ask) or _MATH_NOTATION.search(text) or _is_numeric(text):
        return "math"
    return "text" if shape == "text" else "chat"


def _weighted_len(text: str) -> int:
    # A CJK character carries about as much as three Latin ones (and tokenises to more tokens).
    if len(text) >= DOCUMENT_CHARS:
        return len(text)
    return len(text) + 2 * sum(map(len, _CJK.findall(text)))


def _at_least(matches, k: int) -> bool:
    for i, _ in enumerate(matches, start=1):
        if i >= k:
            return True
    return False


def _is_numeric(text: str) -> bool:
    numbers = _NUMBER.findall(text)
    if not numbers:
        return False
    quantities = [n for n in numbers if not _YEAR.fullmatch(n)]
    if len(quantities) >= 3 and _QUESTION.search(text):
        return True
    digits = sum(map(len, _DIGITS.findall(text)))
    return digits >= 0.08 * max(len(text), 1) and _ARITHMETIC.search(text) is not None
