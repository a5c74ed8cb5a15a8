"""The ``--device`` a command runs on, checked before any work starts.

quantkit computes on the CPU or a CUDA device. A name torch does not know (``tpu``), a
device type quantkit does not support (``mps``) or a CUDA device this machine lacks fails
with one line naming the flag, instead of deep inside the first layer:

    >>> check_device("cpu")
    device(type='cpu')
    >>> check_device("tpu")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: --device: 'tpu' is not a device name (use cpu, cuda or cuda:N)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import QuantkitError

if TYPE_CHECKING:
    import torch

SUPPORTED = ("cpu", "cuda")


def check_device(name: str | torch.device, flag: str = "--device") -> torch.device:
    """``name`` as a ``torch.device`` this machine has, or a ``QuantkitError`` naming ``flag``."""
    import torch   # here: every command checks its --device first, and --help should not wait for torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise QuantkitError(f"{flag}: {str(name)!r} is not a device name (use cpu, cuda or cuda:N)") from None
    if device.type not in SUPPORTED:
        raise QuantkitError(f"{flag}: device type '{device.type}' is not supported (use cpu, cuda or cuda:N)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise QuantkitError(f"{flag}: {str(name)!r} asked for, but {why} (use --device cpu)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise QuantkitError(f"{flag}: {str(name)!r} asked for, but this machine has {count} CUDA "
                                f"device{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})")
    return device
