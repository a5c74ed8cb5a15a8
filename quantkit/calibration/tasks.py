"""Task types: taken from the log's task field when present, otherwise inferred by rules.

Inference rules (read the instruction: system + user turns, or the prompt), first match wins:

1. ``translation``    "translate", "into English/Chinese/...", 翻译, 译成/译为
2. ``summarisation``  "summarise/summarize/summary", "tl;dr", "key points", 总结, 摘要, 概括, 归纳
3. ``extraction``     "extract", "list all", "find all", "named entities", 提取, 抽取, 找出所有, 列出所有
4. ``classification`` "classify", "categorise", "sentiment", "positive or negative",
                      "which category/label", 分类, 情感, 正面还是负面, 类别
5. ``code``           a fenced code block, >= 3 code-shaped lines (def/class/import/#include/
                      function/return/...), or "write/fix/debug/refactor ... function/code/script",
                      写函数/写代码, 代码
6. ``qa_document``    a chat/prompt instruction of >= 1,500 characters (a document is attached)
                      whose first or last 400 characters ask something ("?", what/who/how/...,
                      根据, 是什么, 为什么, 哪)
7. ``math``           "calculate/compute/solve/equation/how many/probability/...", 计算, 求解,
                      方程, or digit-dense text with arithmetic ("12 * 7", "3.5 + 4")
8. ``chat``           any other chat or prompt row; raw-text rows fall back to ``text``.

Instruction verbs come before content signals on purpose: "summarise this code" is a
summarisation request, and a long report full of figures with a question is QA, not math.
Labels from a task field are kept verbatim (lower-cased, spaces to underscores), so a log's own
taxonomy is respected; ``TASK_ALIASES`` only folds common spellings onto the rule names.
"""

from __future__ import annotations

import re

TASK_TYPES = ("translation", "summarisation", "extraction", "classification", "code",
              "qa_document", "math", "chat", "text")

TASK_ALIASES = {
    "summarization": "summarisation", "summary": "summarisation", "summarize": "summarisation",
    "translate": "translation", "classify": "classification", "extract": "extraction",
    "information_extraction": "extraction", "coding": "code", "programming": "code",
    "qa": "qa_document", "document_qa": "qa_document", "rag": "qa_document",
    "mathematics": "math", "arithmetic": "math", "conversation": "chat", "dialogue": "chat",
}

INSPECT_CHARS = 6000  # rules look at the head and tail of long instructions only (speed)
DOCUMENT_CHARS = 1500
ASK_CHARS = 400  # where the question around an attached document is looked for (head or tail)

_I = re.IGNORECASE
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("translation", re.compile(
        r"\btranslat(e|ed|ion|ing)\b|\binto (english|chinese|french|german|spanish|japanese|korean)\b"
        r"|翻译|译成|译为|英译中|中译英", _I)),
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
_CODE_FENCE = re.compile(r"```")
_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import |#include|public |private |function |const |let "
    r"|var |return\b|if \(|for \(|}\s*$|@\w+)", re.MULTILINE)
_CODE_ASK = re.compile(
    r"\b(write|implement|debug|fix|refactor|optimi[sz]e)\b.{0,40}\b(function|code|script|class|"
    r"program|query|regex)\b|写(一个)?(函数|程序|代码|脚本)|代码", _I)
_QUESTION = re.compile(r"[?？]|\b(what|who|when|where|why|how|which)\b|根据|是什么|为什么|哪", _I)
_MATH_ASK = re.compile(
    r"\b(calculate|compute|solve|equation|how many|how much|probability|percentage|integral|"
    r"derivative)\b|计算|求解|方程", _I)
_ARITHMETIC = re.compile(r"\d\s*[-+*/×÷^=]\s*\d")
_DIGIT = re.compile(r"\d")


def normalise_task(label: str) -> str:
    return TASK_ALIASES.get(label, label)


def infer_task(instruction: str, shape: str) -> str:
    """The task type of one row by the rules above (see the module docstring)."""
    text = instruction if len(instruction) <= INSPECT_CHARS else \
        instruction[: INSPECT_CHARS // 2] + "\n" + instruction[-INSPECT_CHARS // 2:]
    for task, pattern in RULES:
        if pattern.search(text):
            return task
    if _CODE_FENCE.search(text) or len(_CODE_LINE.findall(text)) >= 3 or _CODE_ASK.search(text):
        return "code"
    if shape != "text" and len(instruction) >= DOCUMENT_CHARS and (
            _QUESTION.search(instruction[:ASK_CHARS]) or _QUESTION.search(instruction[-ASK_CHARS:])):
        return "qa_document"
    if _MATH_ASK.search(text) or _is_numeric(text):
        return "math"
    return "text" if shape == "text" else "chat"


def _is_numeric(text: str) -> bool:
    digits = len(_DIGIT.findall(text))
    return digits >= 0.08 * max(len(text), 1) and _ARITHMETIC.search(text) is not None
