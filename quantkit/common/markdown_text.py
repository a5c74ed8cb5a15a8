"""User text in the Markdown reports, inert: it stays text and a table cell stays one cell.

Slice names, task labels, languages, example text and paths come from the user's files; raw,
``<img src=x onerror=...>`` is live HTML in every renderer that passes HTML through, and a
``|`` or a newline splits or ends a table row. The HTML reports escape the same text.
"""

from __future__ import annotations

import re

#: what turns text into markup: a backslash before punctuation (or ending the text, where it
#: would escape a cell's closing ``|``), an entity (``&lt;``), a tag (``<img``, ``</b``, ``<!--``), a
#: table's ``|``, a code span's backtick, and a ``]`` that closes a link or a reference (``](``,
#: ``][``, ``]:``). Everything else is plain text that reads the same raw and rendered: a comparison
#: ``0.31 > 0.1``, a bracketed ``[0.02, 0.05]``, a lone ``&``.
_BACKSLASH = re.compile(r"\\(?=[!-/:-@\[-`{-~\r\n]|$)")
_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")
_TAG = re.compile(r"<[A-Za-z/!?]")
_LINK_END = re.compile(r"\](?=[(\[:])")
_NEWLINES = re.compile(r"\r\n|\r|\n")


def md_text(value: object) -> str:
    r"""``value`` as text for a Markdown table cell or list item, escaped only where it would turn
    into markup, so that it reads the same in the file and in a viewer: ``<`` and ``>`` as entities
    when the text holds a tag, an entity's ``&`` as ``&amp;``, ``|``, backticks, a link's ``]`` and
    a backslash before punctuation backslash-escaped, line breaks as ``<br>``.

    >>> md_text("numbers-en: kl_mean 0.31 > 0.1 [0.2, 0.4]")
    'numbers-en: kl_mean 0.31 > 0.1 [0.2, 0.4]'
    >>> md_text("<img src=x onerror=alert(1)> | [a](javascript:x) &lt;")
    '&lt;img src=x onerror=alert(1)&gt; \\| [a\\](javascript:x) &amp;lt;'
    """
    text = _ENTITY.sub("&amp;", _BACKSLASH.sub(r"\\\\", str(value)))
    if _TAG.search(text):
        text = text.replace("<", "&lt;").replace(">", "&gt;")
    text = _LINK_END.sub(r"\\]", text.replace("|", "\\|").replace("`", "\\`"))
    return _NEWLINES.sub("<br>", text)


def md_code(value: object) -> str:
    """``value`` as a Markdown code span (shown verbatim, never markup): fenced by more
    backticks than it holds in a row, on one line."""
    text = _NEWLINES.sub(" ", str(value))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_cell_code(value: object) -> str:
    """``md_code`` for a table cell: GFM splits cells at every unescaped ``|``, code spans
    included, so each is escaped (shown as ``|`` inside the span)."""
    return md_code(value).replace("|", "\\|")


def md_row(cells: "list | tuple") -> str:
    """One Markdown table row of ``cells``, each ``md_text``."""
    return "| " + " | ".join(md_text(c) for c in cells) + " |"
