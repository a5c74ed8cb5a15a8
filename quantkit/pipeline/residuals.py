"""What the quantizer left in each output row, saved beside the checkpoint for the integrity pass.

For every quantized module the conversion records, per output row ``r``, the squared error
the quantizer chose, ``e_r = Σ_j (Q_rj - W_rj)²`` (``W``: the weight it was given, transforms
applied; ``Q``: its dequantized result, the values that get packed). The integrity pass
(``evaluation/integrity``) decodes the packed files again and compares its own ``d_r`` with
``e_r``: a clean checkpoint gives them back to rounding, whatever the quantizer did, while
any damage after the quantizer (packing, writing, copying, editing) adds to some row. GPTQ
moves error between columns by design, so without this record a row or group can only be
compared with round to nearest plus a wide allowance.

The rows go to ``integrity/layer-NNNNN.safetensors`` (a sub-folder: serving engines glob the
top folder's ``*.safetensors``), float32, keyed by the module's full name.
"""

from __future__ import annotations

from pathlib import Path

import torch

FOLDER = "integrity"


def row_errors(weight: torch.Tensor, dequantized: torch.Tensor) -> torch.Tensor:
    """``e_r = Σ_j (Q_rj - W_rj)²`` per output row, accumulated in float64, stored as float32."""
    return (dequantized.float() - weight.float()).pow_(2).sum(1, dtype=torch.float64).float()


def layer_file(folder: Path, layer: int) -> Path:
    return Path(folder) / FOLDER / f"layer-{layer:05d}.safetensors"


def save_layer(folder: Path, layer: int, rows: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    if not rows:
        return
    path = layer_file(folder, layer)
    path.parent.mkdir(exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in rows.items()}, str(path))


def load(folder: Path) -> dict[str, torch.Tensor]:
    """Every recorded module's row errors in ``folder`` (empty when the checkpoint has no record)."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted((Path(folder) / FOLDER).glob("layer-*.safetensors")):
        out.update(load_file(str(path)))
    return out
