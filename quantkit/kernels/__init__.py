"""Matrix-product backends for QuantLinear, keyed by (checkpoint format, backend name).

Every backend reads the same tensors (the checkpoint's); "torch" is the reference that runs
anywhere, "triton" runs on CUDA. ``select_backend`` picks the default for a device;
``QUANTKIT_BACKEND`` or ``quantkit.load(..., backend=)`` overrides it.
"""

from __future__ import annotations

import os
from typing import Callable

from ..errors import QuantkitError

BACKENDS: dict[tuple[str, str], Callable] = {}


def register_backend(fmt: str, name: str):
    def deco(fn):
        BACKENDS[(fmt, name)] = fn
        return fn

    return deco


def get_backend(fmt: str, name: str) -> Callable:
    _ensure_loaded()
    fn = BACKENDS.get((fmt, name))
    if fn is None:
        have = sorted(n for f, n in BACKENDS if f == fmt)
        raise QuantkitError(f"backend: '{name}' is not available for format '{fmt}' (available: {', '.join(have)})")
    return fn


def select_backend(device_type: str, override: str | None = None) -> str:
    """The backend to use on a device: the override, ``$QUANTKIT_BACKEND``, else triton on CUDA."""
    choice = override or os.environ.get("QUANTKIT_BACKEND")
    if choice:
        if choice not in ("torch", "triton"):
            raise QuantkitError(f"backend: unknown backend '{choice}' (torch, triton)")
        return choice
    _ensure_loaded()
    if device_type == "cuda" and any(n == "triton" for _, n in BACKENDS):
        return "triton"
    return "torch"


_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from . import reference  # noqa: F401  (registers "torch")

    _load_triton()


def _load_triton() -> None:
    # ---- triton backends (kernels issue): import guarded so the torch path never breaks ----
    try:
        from . import fp8_gemm, int4_gemm, int8_gemm
    except Exception as exc:  # no triton, or a broken install: the torch reference still serves
        import logging

        logging.getLogger("quantkit").info("triton backends unavailable: %s", exc)
        return
    register_backend("pack-quantized", "triton")(int4_gemm.w4a16_linear)
    register_backend("int-quantized", "triton")(int8_gemm.int8_linear)
    register_backend("float-quantized", "triton")(fp8_gemm.fp8_linear)
    # ---- end of the triton block ----
