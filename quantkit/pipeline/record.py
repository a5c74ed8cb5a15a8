"""What the transforms of each layer found, saved beside the checkpoint and read back to re-apply.

Each layer's ``TransformResult`` tensors go to ``transforms/layer-NNNNN.safetensors`` in the
output folder (a sub-folder: serving engines glob the top folder's ``*.safetensors``), keyed
``"<step index>.<step name>.<key>"``; the summaries go to ``quantization_log.json`` under
``transforms``. A recipe step with ``load_from: DIR`` (an earlier output) applies the saved
result of the same layer and step instead of searching again.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quantkit.steps import TransformResult
from quantkit.errors import QuantkitError

FOLDER = "transforms"


def step_key(index: int, name: str) -> str:
    return f"{index}.{name}"


def layer_file(folder: Path, layer: int) -> Path:
    return Path(folder) / FOLDER / f"layer-{layer:05d}.safetensors"


def save_layer(folder: Path, layer: int, results: dict[str, TransformResult]) -> None:
    from safetensors.torch import save_file

    tensors = {f"{key}.{k}": t.detach().contiguous().cpu() for key, r in results.items() for k, t in r.tensors.items()}
    if not tensors:
        return
    path = layer_file(folder, layer)
    path.parent.mkdir(exist_ok=True)
    save_file(tensors, str(path))


def load_result(source_dir: str | Path, layer: int, layer_name: str, key: str, where: str) -> TransformResult:
    """The saved result of step ``key`` on ``layer`` in an earlier output folder."""
    from safetensors.torch import load_file

    folder = Path(source_dir)
    path = layer_file(folder, layer)
    log = folder / "quantization_log.json"
    if not path.exists() or not log.exists():
        raise QuantkitError(f"{where}.load_from: {folder} holds no saved transforms for {layer_name} "
                            f"(needs {FOLDER}/{path.name} and quantization_log.json)")
    try:
        summary = json.loads(log.read_text())["transforms"][layer_name][key]
    except (KeyError, json.JSONDecodeError):
        raise QuantkitError(f"{where}.load_from: {log} has no summary for step '{key}' of {layer_name}") from None
    prefix = key + "."
    tensors: dict[str, torch.Tensor] = {k[len(prefix):]: t for k, t in load_file(str(path)).items() if k.startswith(prefix)}
    if not tensors:
        raise QuantkitError(f"{where}.load_from: {path} has no tensors for step '{key}'")
    return TransformResult(tensors, dict(summary))
