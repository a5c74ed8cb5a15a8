"""The serving engines quantkit can start, by the name ``--engine`` takes."""
from __future__ import annotations

from quantkit.errors import QuantkitError
from quantkit.serving import vllm
from quantkit.serving.contract import EngineKind

ENGINES: dict[str, EngineKind] = {vllm.NAME: vllm.KIND}
DEFAULT_ENGINE = vllm.NAME   # the one quantkit plan --emit and the launch config name by default


def engine_kind(name: str, flag: str = "--engine") -> EngineKind:
    """The engine registered as ``name``; one line naming ``flag`` otherwise."""
    if name not in ENGINES:
        raise QuantkitError(f"{flag}: {name!r}: expected one of {', '.join(ENGINES)}")
    return ENGINES[name]
