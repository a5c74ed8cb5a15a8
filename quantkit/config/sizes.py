"""Sizes in bytes as people write them: the one reading of "2GB", "512MiB" or "80G" that the
recipe (``output.max_shard_size``, ``calibration.layer_memory``) and ``--gpu-mem`` share.

The meaning, case-insensitive, with or without a space before the unit:

- a bare number or ``B``: bytes;
- ``KB``, ``MB``, ``GB``, ``TB``: decimal (``2GB`` is 2 * 10**9), as disk and HF shard sizes count;
- ``KiB``, ``MiB``, ``GiB``, ``TiB``: binary (``2GiB`` is 2 * 2**30);
- ``K``, ``M``, ``G``, ``T`` alone: binary as well (``2G`` is ``2GiB``), as ``free -h``, ``ulimit``
  and GPU memory figures mean them.

A fraction is allowed and the bytes are rounded down (``1.5GB`` is 1500000000).

>>> size_bytes("2GB"), size_bytes("2 gb")
(2000000000, 2000000000)
>>> size_bytes("2GiB") == size_bytes("2G") == 2 * 2**30
True
>>> size_bytes("500MiB"), size_bytes("60KB"), size_bytes("1.5GB"), size_bytes("4096"), size_bytes("4096B")
(524288000, 60000, 1500000000, 4096, 4096)
>>> size_bytes("1TB"), size_bytes("1T")
(1000000000000, 1099511627776)
>>> size_bytes("lots") is None, size_bytes("2GBs") is None, size_bytes("-1GB") is None
(True, True, True)
"""

from __future__ import annotations

import math
import re

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}

_SIZE = re.compile(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def size_bytes(text: str) -> int | None:
    """The bytes ``text`` names (the module's docstring gives the units), or None when it is
    not a size; the caller says where it was read."""
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2).lower() not in UNITS:
        return None
    value = float(m.group(1)) * UNITS[m.group(2).lower()]
    return int(value) if math.isfinite(value) else None
