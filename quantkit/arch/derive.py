"""The architecture of a model quantkit has no entry for, derived from the model itself.

Nothing here reads a projection's name. The decoder layers are the module list that holds
``num_hidden_layers`` blocks of the language model; the linears, their true-sequential order
and their sub-groups come from one traced forward (``trace.py``); smoothing/AWQ mappings are
kept only where the traced data flow shows that per-channel scales fold away exactly, which is
then checked numerically on the norm's own code. What a trace cannot show (a residual
rotation's writers, packed-row masks) is not guessed: those features refuse the family.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch
from torch import nn

from quantkit.arch.experts_layout import expert_sizes, fused_names
from quantkit.arch.spec import ArchSpec, MoESpec, SmoothMapping
from quantkit.arch.trace import LayerTrace, trace_layers
from quantkit.errors import QuantkitError

#: Ops that read a tensor without using its values (attribute access, dtype casts to itself).
_NOT_READS = {"__get__", "size", "dim"}
NO_ATTENTION = "its traced forward calls no attention function (softmax or scaled_dot_product_attention), so it has no KV cache to quantize"
NO_ROTATION = ("quantkit derives no residual-stream writers from a traced forward (the residual add is no "
               "module), so a residual rotation needs the family described in quantkit/arch/")


def language_config(config):
    """The text model's config (a vision-language config keeps it as ``text_config``)."""
    text = getattr(config, "get_text_config", None)
    return text() if callable(text) else config


def find_layers(model: nn.Module, config) -> str:
    """The path of the module list holding the language model's ``num_hidden_layers`` decoder layers.

    Under a vision-language wrapper the vision tower has block lists too; the language model's
    is the one inside ``get_decoder()`` where transformers names it, else the only candidate.
    """
    count = getattr(language_config(config), "num_hidden_layers", None)
    found = [n for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == count and n]
    if len(found) > 1 and hasattr(model, "get_decoder"):
        decoder = model.get_decoder()
        inside = [n for n in found if any(m is decoder for m in _ancestors(model, n))]
        found = inside or found
    if len(found) != 1:
        shown = ", ".join(found) if found else "none"
        raise QuantkitError(f"{type(model).__name__}: cannot tell its decoder layers (module lists of "
                            f"num_hidden_layers={count} blocks: {shown}); describe the family in quantkit/arch/")
    return found[0]


def _ancestors(model: nn.Module, path: str) -> Iterable[nn.Module]:
    parts = path.split(".")
    for i in range(len(parts)):
        yield model.get_submodule(".".join(parts[:i]))


def derive_spec(model: nn.Module, config, moe: MoESpec | None = None) -> ArchSpec:
    """An ``ArchSpec`` from ``model`` (a meta skeleton is enough) and one traced forward; ``moe``,
    a family file's description of experts held otherwise than by convention, is checked instead
    of derived."""
    layers_path = find_layers(model, config)
    layers = model.get_submodule(layers_path)
    traces = trace_layers(model, layers)
    keep = _merge((tuple(_kept(layer, t)),) for layer, t in zip(layers, traces))
    kept = {n for g in keep for n in g}
    subgroups = _merge(tuple(tuple(n for n in names if n not in kept) for _, names in t.groups()) for t in traces)
    mappings: list[SmoothMapping] = []
    offsets: set[float] = set()
    for layer, t in zip(layers, traces):
        for m, offset in _norm_mappings(layer, t) + _product_mappings(t):
            if m not in mappings:
                mappings.append(m)
                if offset is not None:
                    offsets.add(offset)
    if len(offsets) > 1:   # norms that fold differently in one model: keep the linear-to-linear mappings only
        mappings = [m for m in mappings if isinstance(layers[0].get_submodule(m.smooth), nn.Linear)]
    offset = offsets.pop() if len(offsets) == 1 else 0.0
    attention = next((t.attention for t in traces if t.attention), None)
    attending = tuple(i for i, t in enumerate(traces) if t.attention)
    moe = next(filter(None, (experts_spec(layer, moe) for layer in layers)), None)
    return ArchSpec(layers=layers_path, subgroups=subgroups, moe=moe, keep=tuple(n for g in keep for n in g), fused=tuple(g for g in subgroups if len(g) > 1),
                    smooth_mappings=tuple(mappings), attention=attention, k_proj=None, v_proj=None,
                    norm_weight_offset=offset, packed_calibration=False, residual_writers=(),
                    residual_rotation_blocked=NO_ROTATION, derived=True,
                    kv_cache_blocked="" if attention else NO_ATTENTION,
                    attention_layers=None if len(attending) == len(traces) else attending)


def _kept(layer: nn.Module, t: LayerTrace) -> list[str]:
    """Linears that stay in the model's dtype: a router (its output picks experts through a
    top-k) and a scalar gate (one output). Quantizing either changes which experts run, or
    scales a whole branch, for no memory worth having."""
    out = []
    inside_topk = {where for reads in t.readers.values() for op, where in reads if op == "topk"}
    for name, _ in t.calls:
        m = layer.get_submodule(name)
        tid = t.outputs.get(name)
        # a router may take its own top-k (Llama 4's returns scores, not logits)
        if name not in out and (m.out_features == 1 or name in inside_topk
                                or (tid is not None and t.reaches(tid, {"topk"}))):
            out.append(name)
    return out


def experts_spec(layer: nn.Module, described: MoESpec | None = None) -> MoESpec | None:
    """The layer's sparse experts when transformers holds them as its convention has it
    (``gate_up_proj`` ``[E, 2I, H]`` gate rows then up rows, ``down_proj`` ``[E, H, I]``, no
    biases), stored per expert as ``<experts>.<e>.gate_proj|up_proj|down_proj``; None for a
    dense layer. A family file's ``described`` experts (another ``ExpertLayout``) are checked
    against the module instead. Experts held otherwise are refused until their family is described."""
    for name, m in layer.named_modules():
        gate_up = getattr(m, "gate_up_proj", None)
        if not (isinstance(gate_up, torch.Tensor) and gate_up.ndim == 3):
            continue
        block, _, leaf = name.rpartition(".")
        moe = described or MoESpec(block=block, checkpoint_block=block, experts=leaf, router=_router(layer, block, gate_up))
        if not (f"{moe.block}.{moe.experts}" == name and _fits(m, moe) and "." not in block):
            held = (f"its family file describes them ({described.layout})" if described else
                    "transformers' convention has them ([experts, 2 x inter, hidden], no biases)")
            raise QuantkitError(f"{type(layer).__name__}: its experts '{name}' (gate_up_proj {tuple(gate_up.shape)}) "
                                f"are not held as {held}; describe the family in quantkit/arch/")
        return moe
    return None


def _router(layer: nn.Module, block: str, gate_up: torch.Tensor) -> str:
    """The block's child whose 2-D weight has one row per expert (its router)."""
    return next((n for n, c in layer.get_submodule(block).named_children()
                 if isinstance(getattr(c, "weight", None), torch.Tensor) and c.weight.ndim == 2
                 and c.weight.shape[0] == gate_up.shape[0]), "gate")


def _fits(m: nn.Module, moe: MoESpec) -> bool:
    """Whether the fused module ``m`` holds its tensors as ``moe.layout`` says."""
    tensors = {n: getattr(m, n, None) for n in fused_names(moe)}
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        return False
    if not moe.layout.bias and isinstance(getattr(m, f"{moe.fused[0]}_bias", None), torch.Tensor):
        return False
    gate_up, down = tensors[moe.fused[0]], tensors[moe.fused[1]]
    num, hidden, inter = expert_sizes(moe, tuple(gate_up.shape))
    want = (num, inter, hidden) if moe.layout.transposed else (num, hidden, inter)
    biases = [tuple(t.shape) for n, t in tensors.items() if n.endswith("_bias")]
    return tuple(down.shape) == want and biases in ([], [(num, 2 * inter), (num, hidden)])


def _merge(per_layer: Iterable[tuple[tuple[str, ...], ...]]) -> tuple[tuple[str, ...], ...]:
    """Every layer kind's sub-groups, in the order first seen; a name keeps its first group."""
    out: list[tuple[str, ...]] = []
    placed: set[str] = set()
    for groups in per_layer:
        for g in groups:
            fresh = tuple(n for n in g if n not in placed)
            if fresh:
                out.append(fresh)
                placed.update(fresh)
    return tuple(out)


def _reads(t: LayerTrace, tid: int, owner: str | None) -> list[tuple[str, str]]:
    """The ops that used tensor ``tid``'s values, those of its own producer ``owner`` left out."""
    return [(op, where) for op, where in t.readers.get(tid, [])
            if op not in _NOT_READS and not (owner and (where == owner or where.startswith(owner + ".")))]


def _parent(names: tuple[str, ...]) -> str:
    """The smallest module holding every one of ``names``."""
    parts = [n.split(".")[:-1] for n in names]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _norm_mappings(layer: nn.Module, t: LayerTrace) -> list[tuple[SmoothMapping, float | None]]:
    """A norm whose output reaches nothing but the linears that read it, and folds exactly."""
    found = []
    for tid, names in t.groups():
        norm = t.producer.get(tid)
        if norm is None or norm in names or isinstance(layer.get_submodule(norm), nn.Linear):
            continue
        reads = _reads(t, tid, norm)
        if any(op != "linear" or where not in names for op, where in reads):
            continue
        offset = fold_offset(layer.get_submodule(norm))
        if offset is not None:
            found.append((SmoothMapping(norm, tuple(names), _parent(tuple(names))), offset))
    return found


def _product_mappings(t: LayerTrace) -> list[tuple[SmoothMapping, float | None]]:
    """A linear whose output reaches one other linear only through an elementwise product."""
    found = []
    inputs = {tid: names for tid, names in t.groups()}
    for name, out in t.outputs.items():
        product = t.products.get(out)
        if product is None or len(_reads(t, out, name)) != 1:
            continue
        (consumer, *more) = inputs.get(product, [None])
        reads = _reads(t, product, None)
        if consumer is None or more or reads != [("linear", consumer)]:
            continue
        found.append((SmoothMapping(name, (consumer,), consumer), None))
    return found


def fold_offset(norm: nn.Module) -> float | None:
    """The weight offset under which dividing ``norm``'s weight and bias by per-channel scales
    divides its output by them (0 for ``x * w``, 1 for Gemma-style ``x * (1 + w)``), measured
    on a float64 copy of the module with random weights; None when neither holds."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 1:
        return None
    g = torch.Generator().manual_seed(0)
    n = weight.shape[0]
    x = torch.randn(3, n, generator=g, dtype=torch.float64)
    s = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    w = torch.randn(n, generator=g, dtype=torch.float64)
    bias = getattr(norm, "bias", None)
    b = torch.randn(n, generator=g, dtype=torch.float64) if isinstance(bias, torch.Tensor) else None
    for offset in (0.0, 1.0):
        try:
            y = _run(norm, x, w, b)
            folded = _run(norm, x, (offset + w) / s - offset, None if b is None else b / s)
        except Exception:  # a module that is not a plain channel-wise norm
            return None
        # norms compute in float32 whatever their input: a wrong offset misses by O(1), not 1e-6
        if torch.allclose(folded, y / s, rtol=1e-5, atol=1e-6):
            return offset
    return None


def _run(norm: nn.Module, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    m = copy.deepcopy(norm).to_empty(device="cpu").to(torch.float64)
    with torch.no_grad():
        m.weight.copy_(w)
        if b is not None:
            m.bias.copy_(b)
        return m(x)
