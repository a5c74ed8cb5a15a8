"""The tensors outside the decoder layers as a residual rotation leaves them.

``RotatedSource`` wraps the run's tensor source: the embedding is read turned (``E Q``), the
LM head with the final norm's weight folded in and turned (``W diag(offset + w) Q``), the final
norm as its neutral weight; a tied head is served under its own name (the checkpoint then holds
both, and its config says untied). Everything else is the wrapped source's. The copy of the
outer tensors and the capture of the first layer's inputs both read through it, so the
calibration runs on the rotated model the layers are folded into.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch
from torch import nn

from quantkit.arch.lookup import arch_for
from quantkit.errors import QuantkitError
from quantkit.pipeline.onload import build_skeleton
from quantkit.recipe import Recipe
from quantkit.steps import build_algorithm
from quantkit.transforms.rotate import Rotate
from quantkit.transforms.hadamard_rotations import rotation_matrices, rotation_problem

#: Rows turned at a time: an embedding of 150k x 8k stays a few hundred MiB in float64 per chunk.
ROWS = 8192


def _turned(t: torch.Tensor, q: torch.Tensor, gain: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.empty_like(t)
    for s in range(0, t.shape[0], ROWS):
        rows = t[s:s + ROWS].double()
        if gain is not None:
            rows = rows * gain[None, :]
        out[s:s + ROWS] = (rows @ q).to(t.dtype)
    return out


def outer_names(model: nn.Module) -> tuple[str, str, str]:
    """(embedding weight, LM head weight, final norm weight) as the checkpoint names them."""
    by_module = {id(m): n for n, m in model.named_modules()}
    base = model.base_model_prefix
    emb = by_module[id(model.get_input_embeddings())]
    head = by_module[id(model.get_output_embeddings())]
    return f"{emb}.weight", f"{head}.weight", f"{base}.norm.weight"


class RotatedSource:
    """A tensor source whose embedding, LM head and final norm carry the residual rotation ``q``."""

    def __init__(self, source, names: tuple[str, str, str], q: torch.Tensor, norm_offset: float):
        self._source = source
        self.embedding, self.head, self.norm = names
        self._q, self._offset = q, norm_offset

    def keys(self) -> Iterable[str]:
        keys = list(self._source.keys())
        return keys if self.head in keys else keys + [self.head]

    def __contains__(self, name: str) -> bool:
        return name == self.head or name in self._source

    def where(self, name: str) -> str:
        return self._source.where(self.embedding if name == self.head and name not in self._source else name)

    def describe(self, name: str):
        return self._source.describe(self.embedding if name == self.head and name not in self._source else name)

    def get(self, name: str) -> torch.Tensor:
        if name == self.embedding:
            return _turned(self._source.get(name), self._q)
        if name == self.head:
            w = self._source.get(name if name in self._source else self.embedding)
            return _turned(w, self._q, self._offset + self._source.get(self.norm).double())
        if name == self.norm:
            return torch.full_like(self._source.get(name), 1.0 - self._offset)
        return self._source.get(name)

    def __getattr__(self, attr: str):
        return getattr(self._source, attr)


def check_rotation(config, spec, recipe) -> "Rotate | None":
    """The recipe's ``rotate`` step, None without one; a rotation the model cannot take is refused
    in one line naming the recipe key (``steps[k].rotate.<option>: reason``)."""
    for k, spec_k in enumerate(recipe.steps):
        if spec_k.name != "rotate":
            continue
        step = build_algorithm(spec_k.name, spec_k.options, where=f"steps[{k}]")
        problem = rotation_problem(config, spec, step.rotations)
        if problem is not None:
            option, reason = problem
            raise QuantkitError(f"{recipe.origin}: steps[{k}].rotate.{option}: {reason}")
        return step
    return None


def rotated_inputs(config, spec, model: nn.Module, source, recipe):
    """``(config, source)`` for the run: as given without a residual rotation; else the source
    wrapped (``RotatedSource``) and, for a tied model, a copy of the config that says untied."""
    step = check_rotation(config, spec, recipe)
    q = None if step is None else rotation_matrices(config, step.rotations)[0]
    if q is None:
        return config, source
    if getattr(config, "tie_word_embeddings", False):
        config = copy.deepcopy(config)
        config.tie_word_embeddings = False
    return config, RotatedSource(source, outer_names(model), q, spec.norm_weight_offset)


def recorded_rotation(config, source, recipe: dict | None):
    """``source`` as the conversion recorded in ``recipe`` (``quantization_log.json["recipe"]``)
    read it: wrapped when that recipe rotated the residual stream, else as given (a recipe that
    no longer validates is the reference's to report)."""
    if not recipe:
        return source
    try:
        parsed = Recipe.from_dict(recipe, where="quantization_log.json: recipe")
        if not any(step.name == "rotate" for step in parsed.steps):
            return source
        _, spec = arch_for(config)
        return rotated_inputs(config, spec, build_skeleton(config), source, parsed)[1]
    except QuantkitError:
        return source
