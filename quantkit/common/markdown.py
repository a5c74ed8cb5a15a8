"""User text in the Markdown reports, inert: it stays text and a table cell stays one cell.

Slice names, task labels, languages, example text and paths come from the user's files; raw,
``<img src=x onerror=...>`` is live HTML in every renderer that passes HTML through, and a
``|`` or a newline splits or ends a table row. The HTML reports escape the same text.
"""

from __future__ import annotations

import html
import re

#: Markdown's own characters that would turn text into code, a link or an image (``[``, ``]``: a
#: ``javascript:`` link needs them) or split a table cell; a backslash is doubled so that one
#: ending the text cannot escape the cell's closing ``|``.
_MARKUP = str.maketrans({"\\": "\\\\", "|": "\\|", "`": "\\`", "[": "\\[", "]": "\\]"})
_NEWLINES = re.compile(r"\r\n|\r|\n")


def md_text(value: object) -> str:
    """``value`` as text for a Markdown table cell or list item: HTML-escaped (``<``, ``>``,
    ``&``; quotes are plain text outside attributes), Markdown's markup characters
    backslash-escaped, line breaks as ``<br>``."""
    text = html.escape(str(value), quote=False).translate(_MARKUP)
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
