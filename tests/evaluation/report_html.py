"""Reading a saved report's HTML back: the cells that carry a JSON path, and whole tables,
so tests can check that every number shown equals report.json's. The page shows a number at
three significant digits and carries the JSON's value in the cell's ``data-value``: ``cells``
and the tables hold that value, ``shown`` what a reader sees. A gated figure's cell shows its limit
beside it (``<small class='limit'>``): ``limits`` holds that text by data-path, apart from the value."""
from html.parser import HTMLParser


class Cells(HTMLParser):
    """``cells``: data-path -> the value (``data-value``, else the text) of every ``<td>``/``<span>``
    that names its JSON path; ``shown``: data-path -> its text;
    ``images``: the attributes of every ``<img>``; ``tables``: table id -> rows of
    ``(text, data-path or None)`` cells (header rows included, as ``th`` cells)."""

    def __init__(self):
        super().__init__()
        self.cells, self.shown, self.images, self.tables, self.limits = {}, {}, [], {}, {}
        self._path, self._text, self._value, self._limit = None, "", None, None
        self._table, self._cell = None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "small" and a.get("class") == "limit":
            self._limit = ""
            return
        if "data-path" in a:
            self._path, self._text, self._value = a["data-path"], "", a.get("data-value")
        if tag == "img":
            self.images.append(a)
        if tag == "table":
            self._table = a.get("id")
            if self._table:
                self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = ["", a.get("data-path"), a.get("data-value")]

    def handle_data(self, data):
        if self._limit is not None:
            self._limit += data
            return
        if self._path is not None:
            self._text += data
        if self._cell is not None:
            self._cell[0] += data

    def handle_endtag(self, tag):
        if tag == "small" and self._limit is not None:
            if self._path is not None:
                self.limits[self._path] = self._limit.strip()
            self._limit = None
            return
        if self._path is not None and tag in ("td", "span"):
            self.cells[self._path] = self._text if self._value is None else self._value
            self.shown[self._path] = self._text.strip()
            self._path = None
        if tag in ("td", "th") and self._cell is not None:
            text, path, value = self._cell
            self.tables[self._table][-1].append((text if value is None else value, path))
            self._cell = None
        if tag == "table":
            self._table = None


def parse(html: str) -> Cells:
    p = Cells()
    p.feed(html)
    return p


def lookup(data, path):
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def check_table(rows, data: dict, path_of, first: int = 0) -> int:
    """Every cell of ``rows`` (header first) from column ``first`` on whose JSON path
    ``path_of(row, header)`` gives (None: a text column, skipped) is either "–" where the
    JSON has no value, or the JSON's number, carried as that data-path. Returns how many
    numbers were checked."""
    header = [text for text, _ in rows[0]]
    checked = 0
    for row in rows[1:]:
        assert len(row) == len(header), row
        for col, (text, path) in zip(header[first:], row[first:]):
            want = path_of(row, col)
            if want is None:
                continue
            try:
                value = lookup(data, want)
            except (KeyError, IndexError):
                value = None
            if value is None:
                assert text == "–" and path is None, (want, text)
                continue
            assert path == want, (path, want)
            assert float(text) == value, (want, text, value)
            checked += 1
    return checked
