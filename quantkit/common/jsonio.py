"""Strict JSON out: what quantkit writes parses with any JSON reader.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which JSON has not (a strict
parser, ``jq`` or a browser's ``JSON.parse`` refuses the whole file). A value that is not a
finite number is written as ``null``; ``nonfinite_fields`` says which, for the warning the
writer's caller gives.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (at any depth of dicts, lists and tuples) made None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def tagged_floats(obj: Any) -> Any:
    """``obj`` with every non-finite float written as transformers writes them into ``config.json``
    (``{"__float__": "Infinity"}``, ``"-Infinity"``, ``"NaN"``), which its config reader turns back
    into the float: strict JSON that keeps a config's meaning (Granite 4's ``time_step_limit``
    ``[0.0, inf]``, which ``null`` would break).

    >>> tagged_floats({"limit": [0.0, float("inf")]})
    {'limit': [0.0, {'__float__': 'Infinity'}]}
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")}
    if isinstance(obj, dict):
        return {k: tagged_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [tagged_floats(v) for v in obj]
    return obj


def nonfinite_fields(obj: Any, path: str = "") -> list[str]:
    """The dotted paths (``modules.<name>.sqnr_db``, ``rows.3``) of ``obj``'s non-finite floats."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return [path or "(the value)"]
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return []
    return [f for k, v in items for f in nonfinite_fields(v, f"{path}.{k}" if path else str(k))]


def nonfinite_warning(obj: Any, file: str, shown: int = 3) -> str | None:
    """One warning line naming the fields of ``obj`` (to be written as ``file``) that are not
    finite numbers (the first ``shown`` of them), or None when all are."""
    fields = nonfinite_fields(obj)
    if not fields:
        return None
    more = f" and {len(fields) - shown} more" if len(fields) > shown else ""
    return (f"{file}: {', '.join(fields[:shown])}{more} not a finite number (NaN or infinite); "
            "written as null")


def dumps_strict(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite(obj)`` that cannot write NaN or Infinity (``kwargs`` as ``json.dumps``'s)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


# inside <script>, "<!--", "<script" and "</script" change how the HTML parser reads what follows
# (script data's escaped states), whatever the JSON means; as \uXXXX escapes the same JSON holds no
# "<", ">" or "&" at all (none can stand outside a string in JSON)
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(value, **kw) -> str:
    r"""``value`` as JSON that is safe inside an HTML ``<script>`` element whatever its strings hold.

    >>> print(script_json({"task": "<!--<script>"}))
    {"task": "\u003c!--\u003cscript\u003e"}
    """
    return dumps_strict(value, **kw).translate(_SCRIPT_SAFE)
