"""Hadamard rotations folded into the weights (QuaRot's and SpinQuant's offline rotations).

For an orthogonal ``Q`` (``Q Q^T = I``), a linear reading ``x`` computes the same thing from
``x Q`` with its input columns turned, ``W' = W Q``; one writing ``y`` writes ``y Q`` with its
rows turned, ``W' = Q^T W`` (bias ``b Q``). Rounding ``W Q`` instead of ``W`` spreads every outlier
input channel over all of them, so the groups quantize with less error; the float model is
unchanged (up to float rounding). Two rotations fold away entirely, costing nothing at inference:

- **residual** (R1): the residual stream is carried as ``h Q``. The embedding rows turn
  (``E Q``), every linear that writes the stream (``ArchSpec.residual_writers``) turns its rows,
  and every linear that reads a norm of it turns its columns. An RMSNorm is invariant to an
  orthogonal turn only without its elementwise weight, so each norm's weight is first folded into
  the linears it feeds (``W diag(offset + w)``, the weight then 1 - offset), the final norm's into
  the LM head. A tied LM head is untied: the embedding and the head no longer hold the same matrix.
- **heads** (R2): each value head is carried as ``v H`` for a ``head_dim`` rotation ``H``: the
  value projection's rows of each head turn (``H^T W_v``), and o_proj's columns of every query
  head turn (``W_o H``). Attention weights mix tokens, not channels, so they commute with ``H``.

``Q`` and ``H`` are randomised Hadamard matrices (numerics/hadamard.py). An architecture whose
residual stream passes through a weighted norm after a writer (Gemma3's post-norms) or reaches a
router cannot take the residual rotation (``ArchSpec.residual_rotation_blocked``); the head
rotation applies to every architecture in the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quantkit.arch.spec import ArchSpec, SmoothMapping, _head_dim
from quantkit.numerics.hadamard import hadamard_base, signed_hadamard, signs
from quantkit.transforms.fold import smooth_channels


@dataclass(frozen=True)
class Rotations:
    """Which rotations to fold, and the seed of their random signs (None: plain Hadamard)."""

    residual: bool = True
    heads: bool = True
    seed: int | None = 0


def rotation_problem(config, arch: ArchSpec, rotations: Rotations) -> tuple[str, str] | None:
    """``(option, reason)`` when ``rotations`` cannot fold into this model, else None."""
    if rotations.residual:
        if arch.residual_rotation_blocked:
            return "residual", arch.residual_rotation_blocked
        if hadamard_base(config.hidden_size) is None:
            return "residual", (f"hidden_size {config.hidden_size} is not a power of two times a Hadamard order "
                                f"quantkit builds (numerics/hadamard.py)")
    if rotations.heads:
        if not any(m.kv_heads is not None for m in arch.smooth_mappings):
            return "heads", ("the model's value-to-output fold (value heads into o_proj's columns) is not known: "
                             "a trace cannot show it, so a head rotation needs the family described in quantkit/arch/")
        d = _head_dim(config)
        if hadamard_base(d) is None:
            return "heads", f"head_dim {d} is not a power of two times a Hadamard order quantkit builds"
    return None


def _norm_mappings(layer: nn.Module, arch: ArchSpec) -> list[SmoothMapping]:
    return [m for m in arch.smooth_mappings if not isinstance(layer.get_submodule(m.smooth), nn.Linear)]


def _value_mapping(arch: ArchSpec) -> SmoothMapping:
    (m,) = [m for m in arch.smooth_mappings if m.kv_heads is not None]
    return m


@torch.no_grad()
def fold_norm(norm: nn.Module, readers: list[nn.Linear], offset: float) -> None:
    """Move ``norm``'s elementwise weight into the columns of the linears it feeds."""
    gain = offset + norm.weight.double()
    for lin in readers:
        lin.weight.copy_((lin.weight.double() * gain[None, :]).to(lin.weight.dtype))
    norm.weight.fill_(1.0 - offset)


@torch.no_grad()
def turn_columns(weight: torch.Tensor, q: torch.Tensor, cols: slice = slice(None)) -> None:
    """``W[:, cols] <- W[:, cols] Q`` in place (a linear that reads ``x Q``)."""
    w = weight[:, cols]
    w.copy_((w.double() @ q).to(weight.dtype))


@torch.no_grad()
def turn_rows(lin: nn.Linear, q: torch.Tensor, rows: slice = slice(None)) -> None:
    """``W[rows] <- Q^T W[rows]``, ``b[rows] <- b[rows] Q`` in place (a linear that writes ``y Q``)."""
    w = lin.weight[rows]
    w.copy_((q.T @ w.double()).to(w.dtype))
    if lin.bias is not None:
        b = lin.bias[rows]
        b.copy_((b.double() @ q).to(b.dtype))


def rotate_layer(layer: nn.Module, arch: ArchSpec, config, q: torch.Tensor | None, h: torch.Tensor | None) -> None:
    """Fold the residual rotation ``q`` and the head rotation ``h`` (either may be None) into one
    decoder layer, in place."""
    if q is not None:
        for m in _norm_mappings(layer, arch):
            readers = [layer.get_submodule(b) for b in m.balance]
            fold_norm(layer.get_submodule(m.smooth), readers, arch.norm_weight_offset)
            for lin in readers:
                turn_columns(lin.weight, q)
        for name in arch.residual_writers:
            turn_rows(layer.get_submodule(name), q)
    if h is not None:
        m = _value_mapping(arch)
        producer, rows = smooth_channels(layer, m, config)
        (consumer,) = (layer.get_submodule(b) for b in m.balance)
        d = h.shape[0]
        for start in range(rows.start, rows.stop, d):
            turn_rows(producer, h, slice(start, start + d))
        for start in range(0, consumer.in_features, d):
            turn_columns(consumer.weight, h, slice(start, start + d))


def final_norm(model: nn.Module) -> nn.Module:
    """The norm between the last decoder layer and the LM head."""
    return getattr(model, model.base_model_prefix).norm


@torch.no_grad()
def rotate_edges(model: nn.Module, arch: ArchSpec, q: torch.Tensor) -> None:
    """The residual rotation's parts outside the decoder layers: the embedding rows turn, the
    final norm folds into the LM head, whose columns turn; a tied head is untied first."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head.weight is emb.weight or head.weight.data_ptr() == emb.weight.data_ptr():
        head.weight = nn.Parameter(emb.weight.detach().clone(), requires_grad=False)
        model.config.tie_word_embeddings = False
        text = getattr(model.config, "get_text_config", lambda: None)()
        if text is not None:
            text.tie_word_embeddings = False
    turn_columns(emb.weight, q)
    fold_norm(final_norm(model), [head], arch.norm_weight_offset)
    turn_columns(head.weight, q)


def rotation_signs(config, rotations: Rotations) -> dict[str, torch.Tensor]:
    """The random signs of the rotations asked for: ``residual`` (hidden size) and ``heads``
    (head_dim); the matrices are ``signed_hadamard`` of them."""
    out = {}
    if rotations.residual:
        out["residual"] = signs(config.hidden_size, rotations.seed)
    if rotations.heads:
        out["heads"] = signs(_head_dim(config), None if rotations.seed is None else rotations.seed + 1)
    return out


def rotation_matrices(config, rotations: Rotations) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(Q, H)``: the residual and head rotations (float64), None where not asked for."""
    found = rotation_signs(config, rotations)
    return matrices_of(found)


def matrices_of(found: dict[str, torch.Tensor]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(Q, H)`` from ``rotation_signs``' result (None where a rotation is absent)."""
    q, h = found.get("residual"), found.get("heads")
    return (None if q is None else signed_hadamard(q)), (None if h is None else signed_hadamard(h))


def rotate_model(model: nn.Module, arch: ArchSpec, layers: list[nn.Module], rotations: Rotations) -> None:
    """Fold ``rotations`` into a whole float model in memory (the caller checked
    ``rotation_problem``); the model computes the same logits."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    q, h = rotation_matrices(config, rotations)
    if q is not None:
        rotate_edges(model, arch, q)
    for layer in layers:
        rotate_layer(layer, arch, config, q, h)
