"""The weights a checkpoint should reconstruct: the baseline's, with its recorded transforms re-applied.

A transform (AWQ, SmoothQuant) legitimately changes a layer before quantization: balance
linears' input columns times ``s``, norms and producer rows divided by ``s``, AWQ's groups
clipped. The conversion saved what each transform found (``transforms/layer-NNNNN.safetensors``,
``quantization_log.json["transforms"]``, the recipe in ``quantization_log.json["recipe"]``):
here the baseline layer is materialised and each recorded step's own ``apply`` runs on it
again, so the reference is exactly what the quantizer saw (clip included). Layers without a
record are read straight from the baseline's shards, tensor by tensor.

Where a record cannot be re-applied (its file is gone, the step is unknown to this version,
an ``apply`` fails) the layer has no reference; the caller checks its modules from the
checkpoint alone and says why (``Reference.fallback``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from quantkit.steps import LayerContext
from quantkit.arch.lookup import arch_for
from quantkit.errors import QuantkitError
from quantkit.pipeline import build_skeleton, build_steps
from quantkit.pipeline.onload import dematerialize, get_module, materialize
from quantkit.pipeline.record import layer_file, load_result
from quantkit.recipe import Recipe

_UNIT = re.compile(r"^(.+?\.\d+)\.")


def unit_of(key: str) -> str:
    """The streaming unit of a tensor: its first numbered container (``model.layers.3``), or ``""``."""
    m = _UNIT.match(key)
    return m.group(1) if m else ""


def _no_calibration(**_) -> None:
    raise RuntimeError("re-applying a recorded transform must not run the layer")


class Reference:
    """Reference tensors of the baseline, one streaming unit at a time."""

    def __init__(self, config, base_source, cand_dir: Path, log: dict | None, targets_of):
        self.config = config
        self.base = base_source
        self.cand_dir = Path(cand_dir)
        self.targets_of = targets_of           # (layer module, prefix) -> {name: (Linear, scheme)}
        self.fallback: dict[str, str] = {}     # unit -> why it has no reference
        self.transformed: list[str] = []       # units whose transforms were re-applied
        self._records = dict((log or {}).get("transforms") or {})
        self._skeleton: nn.Module | None = None
        self._steps = None
        self._steps_error: str | None = None
        self._spec = None
        if self._records:
            try:
                _, self._spec = arch_for(config)
                recipe = Recipe.from_dict((log or {}).get("recipe") or {}, where="quantization_log.json: recipe")
                self._steps = dict(build_steps(recipe)[0])
            except QuantkitError as e:
                self._steps_error = str(e)

    def tensors(self, unit: str, keys: list[str]) -> dict[str, torch.Tensor] | None:
        """The reference value of every baseline ``key`` of ``unit``; None when it cannot be had."""
        record = self._records.get(unit)
        if not record:
            return {k: self.base.get(k) for k in keys}
        if self._steps_error is not None:
            self.fallback[unit] = f"recorded transforms cannot be re-applied ({self._steps_error})"
            return None
        index = self._layer_index(unit)
        if index is None:
            self.fallback[unit] = "transforms recorded for a unit that is not a decoder layer"
            return None
        if not layer_file(self.cand_dir, index).exists():
            self.fallback[unit] = f"{layer_file(self.cand_dir, index).relative_to(self.cand_dir)} is missing"
            return None
        self._read_transforms(index)
        layer = get_module(self._model(), self._spec.layers)[index]
        prefix = unit + "."
        materialize(layer, prefix, self.base)
        try:
            ctx = LayerContext(index, unit, layer, self.targets_of(layer, prefix), [], run=_no_calibration,
                               arch=self._spec, config=self.config)
            for key in record:
                step = self._steps.get(key)
                if step is None:
                    self.fallback[unit] = f"step '{key}' is not in the recorded recipe"
                    return None
                result = load_result(self.cand_dir, index, unit, key, f"{unit}: {key}")
                step.apply(ctx, result)
            state = {prefix + k: v.detach().clone() for k, v in layer.state_dict().items()}
        except (QuantkitError, RuntimeError, ValueError, KeyError) as e:
            self.fallback[unit] = f"re-applying the recorded transforms failed ({str(e).splitlines()[0]})"
            return None
        finally:
            dematerialize(layer)
        self.transformed.append(unit)
        return {k: state[k] if k in state else self.base.get(k) for k in keys}

    def _layer_index(self, unit: str) -> int | None:
        head, _, idx = unit.rpartition(".")
        return int(idx) if self._spec is not None and head == self._spec.layers and idx.isdigit() else None

    def _model(self) -> nn.Module:
        if self._skeleton is None:
            self._skeleton = build_skeleton(self.config)
        return self._skeleton

    def _read_transforms(self, index: int) -> None:
        """A transforms file that is there but unreadable is bad input: one line naming it."""
        from safetensors import safe_open

        path = layer_file(self.cand_dir, index)
        try:
            with safe_open(path, framework="pt") as f:
                for k in f.keys():
                    f.get_tensor(k)
        except Exception as e:  # safetensors raises its own error types
            raise QuantkitError(f"{path}: not a valid safetensors file, truncated or corrupt ({e})") from None


def read_quantization_log(cand_dir: Path) -> dict | None:
    """``quantization_log.json`` of a checkpoint, or None when it has none."""
    path = Path(cand_dir) / "quantization_log.json"
    if not path.exists():
        return None
    try:
        log = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise QuantkitError(f"{path}: not JSON ({type(e).__name__})") from None
    if not isinstance(log, dict):
        raise QuantkitError(f"{path}: expected a JSON object")
    return log
