"""Long rows for the KV observer: the calibration source's longest rows, added in full.

KV error grows with the context, and keys after the rotary embedding at far positions, or
values after many tokens of a long document, reach ranges short rows never show. The
calibration set is drawn for the weights (``calibration.max_seq_len``, 512 by default); with
``kv_cache: {long_rows: N, long_len: L}`` the ``N`` longest rows of the same source are added,
each cut to ``L`` tokens (the deployment length, 4096 by default). They run through the layer
loop like every sample, so the KV observer sees them whole (and so do the weight algorithms:
more context, not other text). Where the source has no row near ``L``, a warning says how long
its longest are.

Example:
    >>> longest_ids([[1, 2], [3, 4, 5, 6], [7]], 1, 3)
    [[3, 4, 5]]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from quantkit.calibration.calibration_set import _render, default_log_path
from quantkit.calibration.config import SamplerConfig
from quantkit.calibration.encoding import count_tokens, encode_ids, special_affixes, truncate, with_affixes
from quantkit.calibration.io import read_log, row_byte_limit
from quantkit.calibration.output_folder import is_sampler_output, read_output



def longest_ids(rows: Sequence[Sequence[int]], n: int, max_len: int) -> list[list[int]]:
    """The ``n`` longest token-id rows (the first of equals first), each cut to ``max_len``."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))[:n]
    return [list(map(int, rows[i]))[:max_len] for i in order]


def long_rows(source: Any, n: int, max_len: int, tokenizer: Callable[[], Any],
              warn: Callable[[str], None]) -> list[list[int]]:
    """The ``n`` longest rows of a calibration source (what ``quantize(calibration=...)`` takes:
    a log or sampler folder path, ``None`` for the default log, texts, or token-id lists)."""
    if source is not None and not isinstance(source, (str, Path)):
        items = list(source)
        if items and isinstance(items[0], str):
            tok = tokenizer()
            items = [tok(t, add_special_tokens=True)["input_ids"] for t in items]
        rows, full = longest_ids(items, n, max_len), max((len(x) for x in items), default=0)
    else:
        rows, full = _from_log(source, n, max_len, tokenizer())
    if full < max_len:
        warn(f"kv_cache.long_rows: the calibration source's longest row has {full} tokens, under "
             f"long_len {max_len}: the KV scales see no longer context")
    return rows


def _from_log(source: str | Path | None, n: int, max_len: int, tok) -> tuple[list[list[int]], int]:

    path = Path(source) if source is not None and str(source) != "default" else default_log_path()
    if is_sampler_output(path):
        texts = [s["text"] for s in read_output(path)[1]]
    else:
        texts = [r.text for r in _render(read_log(path, row_byte_limit(max_len)), tok, SamplerConfig(max_len=max_len))]
    affixes = special_affixes(tok)
    counts = count_tokens(tok, texts, max_len, affixes)
    order = np.argsort(-counts, kind="stable")[:n]
    rows = [truncate(with_affixes(encode_ids(tok, [texts[i]])[0], affixes), max_len, affixes) for i in order]
    return rows, int(counts.max()) if len(counts) else 0
