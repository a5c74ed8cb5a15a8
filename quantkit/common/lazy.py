"""Package attributes imported when first used (PEP 562), so that importing a package is cheap."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(package: str, where: dict[str, str],
                    namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: name ``n`` is imported from the submodule
    ``where[n]`` (relative, e.g. ``".api"``) on first use and then kept in ``namespace`` (the
    package's globals), so later uses cost nothing."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
