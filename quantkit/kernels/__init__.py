"""Matrix-product backends for QuantLinear, keyed by (checkpoint format, backend name).

Every backend reads the same tensors (the checkpoint's); "torch" is the reference that runs
anywhere, "triton" runs on CUDA. ``select_backend`` picks the default for a device;
``QUANTKIT_BACKEND`` or ``quantkit.load(..., backend=)`` overrides it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

from quantkit.errors import QuantkitError

BACKENDS: dict[tuple[str, str], Callable] = {}

_log = logging.getLogger("quantkit")
_triton_error: str | None = None   # why the triton backends did not load, when they did not
_warned: set[str] = set()          # fallback reasons logged already: one warning per reason a process
_collectors: list[list[str]] = []  # the open ``collecting_fallbacks`` blocks


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
        why = f"; it could not load: {_triton_error}" if name == "triton" and _triton_error else ""
        raise QuantkitError(f"backend: '{name}' is not available for format '{fmt}' "
                            f"(available: {', '.join(have)}){why}")
    return fn


@contextmanager
def collecting_fallbacks() -> Iterator[list[str]]:
    """The fallback reasons recorded inside the block, once each: what the model loaded there runs
    slower than its device's default (the loader keeps them with the model, whose evaluation
    report lists them; a process-wide list would hand one model's fallbacks to the next)."""
    seen: list[str] = []
    _collectors.append(seen)
    try:
        yield seen
    finally:
        _collectors.remove(seen)


def select_backend(device_type: str, override: str | None = None, *, record: bool = True) -> str:
    """The backend to use on a device: the override, ``$QUANTKIT_BACKEND``, else triton on CUDA.

    CUDA without a loadable triton gets the torch reference: a warning, and a reason recorded
    (``record_fallback``), unless ``record`` is False (a question, not a model about to run)."""
    choice = override or os.environ.get("QUANTKIT_BACKEND")
    if choice:
        if choice not in ("torch", "triton"):
            raise QuantkitError(f"backend: unknown backend '{choice}' (torch, triton)")
        return choice
    _ensure_loaded()
    if device_type != "cuda":
        return "torch"
    if any(n == "triton" for _, n in BACKENDS):
        return "triton"
    reason = (f"kernel backend: triton could not load ({_triton_error or 'not registered'}); "
              "CUDA runs the slower torch reference instead")
    if record:
        record_fallback(reason)
    return "torch"


def backend_for_format(fmt: str, name: str, explicit: bool) -> str:
    """``name`` where it has a kernel for ``fmt`` or was asked for by name (``get_backend`` then says
    what is missing); a default choice without one (triton on CUDA for the FP4 formats) gets the
    torch reference, with a warning and a reason recorded (``record_fallback``)."""
    _ensure_loaded()
    if explicit or (fmt, name) in BACKENDS:
        return name
    record_fallback(f"kernel backend: {name} has no kernel for {fmt}; the slower torch reference runs it")
    return "torch"


def record_fallback(reason: str) -> str:
    """A module runs the torch reference instead of the backend asked for: a warning once per
    reason, the reason in every open ``collecting_fallbacks`` block; returns it."""
    if reason not in _warned:
        # a warning, not info: the numbers are right but the speed is not what the user expects
        _log.warning("%s", reason)
        _warned.add(reason)
    for seen in _collectors:
        if reason not in seen:
            seen.append(reason)
    return reason


_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from quantkit.kernels import reference

    for fmt, fn in reference.KERNELS.items():
        register_backend(fmt, "torch")(fn)
    _load_triton()


def _load_triton() -> None:
    global _triton_error
    # ---- triton backends: import guarded so the torch path never breaks ----
    try:
        from quantkit.kernels import fp8_gemm, int4_gemm, int8_gemm
    except Exception as exc:  # no triton, or a broken install: the torch reference still serves
        # recorded, and warned about where a device would have used it (select_backend): a
        # CPU-only machine without triton loses nothing
        _triton_error = f"{type(exc).__name__}: {exc}"
        _log.info("triton backends unavailable: %s", _triton_error)
        return
    register_backend("pack-quantized", "triton")(int4_gemm.w4a16_linear)
    register_backend("int-quantized", "triton")(int8_gemm.int8_linear)
    register_backend("float-quantized", "triton")(fp8_gemm.fp8_linear)
    # ---- end of the triton block ----
