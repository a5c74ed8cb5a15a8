"""MoE experts as per-expert ``nn.Linear`` modules: the form quantization and checkpoints need.

transformers 5 holds a sparse block's experts as fused 3-D parameters (``ArchSpec.moe``:
``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]`` by its convention; other layouts,
gpt-oss's transposed, interleaved and biased experts, are described by ``MoESpec.layout``) and
computes them in one module, while checkpoints on disk and vLLM's MoE loaders name every expert's linears apart.
``unfuse_experts`` replaces each fused experts module (meta or real) by ``UnfusedExperts``, a
``ModuleList`` of ``Expert``s with the checkpoint's names and the fused module's forward, so
the block's own router and top-k code still run and every per-linear part of quantkit
(hooks, Hessians, RTN, packing, writing, ``QuantLinear``) applies to ``<experts>.<e>.<linear>``
unchanged. A block whose checkpoint name differs (Mixtral's ``block_sparse_moe``) is renamed
in the layer's module tree; the layer's forward still finds it under its attribute.

During calibration the runner gives each ``UnfusedExperts`` a ``Routing`` (``.routing``):
the batch's real-token mask, whether every real token goes through every expert for
statistics (the layer's output still sums the top-k experts only), and a record of the
tokens each expert saw (``pipeline/coverage.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, ContextManager, Protocol

import torch
from torch import nn

from quantkit.arch.experts_layout import expert_sizes, expert_tensors, fused_names
from quantkit.arch.spec import ArchSpec, MoESpec
from quantkit.arch.lookup import arch_for
from quantkit.errors import QuantkitError

class Routing(Protocol):
    """What the runner's calibration routing (``pipeline/coverage.py``) gives the experts: the
    batch's real tokens, whether every token runs through every expert, and a record per expert."""

    all_experts: bool
    real_tokens: Callable[[], torch.Tensor | None]

    def dispatch(self, expert: int, routed: int, seen: int) -> ContextManager: ...


class GatedActivation(nn.Module):
    """``act(gate) * up``: how transformers' conventional experts combine their gate and up outputs."""

    def __init__(self, act: nn.Module):
        super().__init__()
        self.act = act

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.act(gate) * up


class Expert(nn.Module):
    """One expert's gated MLP: ``down(act(gate(x), up(x)))``, its linears named as on disk.

    ``act`` combines the gate and up outputs (``GatedActivation(nn.SiLU())``: SwiGLU); ``bias``
    gives every linear a bias (gpt-oss)."""

    def __init__(self, names: tuple[str, str, str], hidden: int, inter: int, act: nn.Module,
                 dtype: torch.dtype, device: torch.device, bias: bool = False):
        super().__init__()
        self.names = names
        gate, up, down = names
        setattr(self, gate, nn.Linear(hidden, inter, bias=bias, dtype=dtype, device=device))
        setattr(self, up, nn.Linear(hidden, inter, bias=bias, dtype=dtype, device=device))
        setattr(self, down, nn.Linear(inter, hidden, bias=bias, dtype=dtype, device=device))
        self.act_fn = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act_fn(gate(x), up(x)))


class UnfusedExperts(nn.ModuleList):
    """The fused experts module's forward over per-expert modules.

    ``forward(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])`` returns the sum over
    each token's top-k experts of weight x expert output, as transformers' experts do (experts
    in ascending order, each token's contributions added into zeros).
    """

    def __init__(self, experts: list[Expert], call: str = "top_k"):
        super().__init__(experts)
        self.call = call   # MoESpec.call: how the block calls its experts
        self.routing: Routing | None = None
        # set while a layer too big for memory runs without its experts (pipeline/expert_stream.py):
        # ``deferred(hidden, top_k_index, top_k_weights)`` records the block's inputs, and
        # the experts add nothing here; their sum is added to the layer's output afterwards
        self.deferred: Callable[..., None] | None = None

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor | None = None,
                top_k_weights: torch.Tensor | None = None) -> torch.Tensor:
        if self.call == "routed_copies":
            return self._routed_copies(hidden_states)
        out = torch.zeros_like(hidden_states)
        if self.deferred is not None:
            self.deferred(hidden_states, top_k_index, top_k_weights)
            return out
        routing = self.routing
        real = routing.real_tokens() if routing is not None else None
        real = real.to(hidden_states.device) if real is not None else None
        for e, expert in enumerate(self):
            if routing is None:
                token, slot = torch.where(top_k_index == e)
                if token.numel():
                    y = expert(hidden_states[token]) * top_k_weights[token, slot, None]
                    out.index_add_(0, token, y.to(out.dtype))
                continue
            # Calibration: each expert runs in every batch, even on no tokens, because the
            # lockstep passes need every linear reached in every batch.
            rows, weight, routed = calibration_rows(e, top_k_index, top_k_weights, real, routing.all_experts)
            with routing.dispatch(e, routed=routed, seen=int(rows.numel())):
                y = expert(hidden_states[rows])
            out.index_add_(0, rows, (y * weight).to(out.dtype))
        return out


    def _routed_copies(self, routed: torch.Tensor) -> torch.Tensor:
        """Expert e on its copy of every token (rows ``e x T`` to ``(e + 1) x T``), already scaled by
        the token's router score: a row no score reached is zeros, whose output is zeros (no biases),
        so only the routed rows run. During calibration those rows are the expert's inputs (a zero
        row would add nothing to its statistics) and padding rows are left out."""
        if self.deferred is not None:
            raise QuantkitError("experts called with routed copies (Llama 4) are not streamed a chunk at a time: "
                                "raise calibration.layer_memory")
        x = routed.view(len(self), -1, routed.shape[-1])
        out = torch.zeros_like(x)
        routing = self.routing
        real = routing.real_tokens() if routing is not None else None
        for e, expert in enumerate(self):
            rows = (x[e] != 0).any(dim=-1)
            if real is not None:
                rows = rows & real.to(rows.device)
            idx = torch.nonzero(rows).flatten()
            if routing is None:
                if idx.numel():
                    out[e].index_copy_(0, idx, expert(x[e][idx]).to(out.dtype))
                continue
            with routing.dispatch(e, routed=int(idx.numel()), seen=int(idx.numel())):
                y = expert(x[e][idx])
            out[e].index_copy_(0, idx, y.to(out.dtype))
        return out.view_as(routed)


def calibration_rows(e: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, real: torch.Tensor | None,
                     all_experts: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The positions expert ``e`` runs on during calibration, their routing weights ``[n, 1]``, and
    how many of them are routed to it.

    Padding (row ends, which no real token attends to) skips the experts, so every expert input
    is a real token. With ``all_experts`` every real token runs through the expert for its
    statistics, and the tokens not routed to it are weighted by exact zeros: the block's top-k
    sum is unchanged. Shared by the block's forward and the expert-by-expert pass, so both add
    the very same numbers in the very same order.
    """
    token, slot = torch.where(top_k_index == e)
    if real is not None:
        keep = real[token]
        token, slot = token[keep], slot[keep]
    if not all_experts:
        return token, top_k_weights[token, slot, None], int(token.numel())
    every = torch.nonzero(real).flatten() if real is not None else torch.arange(
        top_k_index.shape[0], device=top_k_index.device)
    weight = torch.zeros(top_k_index.shape[0], dtype=top_k_weights.dtype, device=top_k_weights.device)
    weight[token] = top_k_weights[token, slot]
    return every, weight[every, None], int(token.numel())


def _spec(config) -> ArchSpec:
    return arch_for(config)[1]


def moe_spec(config) -> MoESpec | None:
    """The MoE entry of the config's architecture (None for a dense or unknown one)."""
    return _spec(config).moe


def kept_patterns(config) -> list[str]:
    """``ignore`` patterns for the MoE blocks' linears the architecture keeps in high precision."""
    return _spec(config).kept()


def unfuse_model(model: nn.Module, config) -> int:
    """``unfuse_experts`` on a model of ``config``'s architecture; a dense one is left as it is."""
    spec = _spec(config)
    if spec.moe is None:
        return 0
    return unfuse_experts(model, spec.layers, spec.moe)


def expert_activation(moe: MoESpec, fused: nn.Module) -> nn.Module:
    """The module combining an expert's gate and up outputs, as the fused module ``fused`` does."""
    return moe.activation(fused) if moe.activation is not None else GatedActivation(fused.act_fn)


def unfuse_experts(model: nn.Module, layers_path: str, moe: MoESpec) -> int:
    """Replace every fused experts module under ``layers_path`` by ``UnfusedExperts``.

    Works on the meta device (the pipeline's skeleton, ``quantkit.load``) and on real weights,
    which are copied expert by expert. Returns the number of blocks unfused. Layers whose MLP
    is dense (Qwen3-MoE's ``mlp_only_layers``) are left as they are.
    """
    count = 0
    for layer in model.get_submodule(layers_path):
        block = getattr(layer, moe.block, None)
        fused = getattr(block, moe.experts, None) if block is not None else None
        if fused is None or not isinstance(getattr(fused, moe.fused[0], None), torch.Tensor):
            continue
        gate_up = getattr(fused, moe.fused[0])
        num, hidden, inter = expert_sizes(moe, tuple(gate_up.shape))
        experts = [Expert(moe.linears, hidden, inter, expert_activation(moe, fused), gate_up.dtype, gate_up.device,
                          bias=moe.layout.bias) for _ in range(num)]
        if gate_up.device.type != "meta":
            tensors = {n: getattr(fused, n) for n in fused_names(moe)}
            with torch.no_grad():
                for e, expert in enumerate(experts):
                    for name, t in expert_tensors(moe, tensors, e).items():
                        expert.get_parameter(name).copy_(t)
        setattr(block, moe.experts, UnfusedExperts(experts, moe.call))
        if moe.checkpoint_block != moe.block:
            _rename_child(layer, moe.block, moe.checkpoint_block)
        count += 1
    return count


def _rename_child(parent: nn.Module, old: str, new: str) -> None:
    """Register child ``old`` as ``new`` (state dicts, module names) in place; ``parent.old`` still
    reaches it, since the parent's forward calls it by that attribute."""
    child = parent._modules[old]
    parent._modules = OrderedDict((new if k == old else k, m) for k, m in parent._modules.items())
    parent.__dict__[old] = child   # found before nn.Module.__getattr__, which no longer knows the name


def per_expert_state(state: dict[str, torch.Tensor], config) -> dict[str, Any]:
    """An in-memory model's state dict with fused experts split as checkpoints name them.

    A block's fused tensors (``<layer>.<block>.<experts>.<fused_names>``) become ``<layer>.
    <checkpoint_block>.<experts>.<e>.<linear>.weight`` (and ``.bias``), sliced as ``moe.layout``
    says; the block's other tensors (the router) move to ``checkpoint_block``. Copies: safetensors
    refuses tensors sharing storage. A dense model's state dict is returned as is.
    """
    spec = _spec(config)
    if spec.moe is None:
        return state
    moe, layers_path = spec.moe, spec.layers
    names = fused_names(moe)
    out: dict[str, Any] = {}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        head, sep, rest = key.partition(f".{moe.block}.")
        if not (sep and head.startswith(layers_path + ".")):
            out[key] = t
            continue
        block = f"{head}.{moe.checkpoint_block}."
        experts, _, leaf = rest.partition(".")
        if experts != moe.experts or leaf not in names:
            out[block + rest] = t
            continue
        pending.setdefault(block, {})[leaf] = t
        if len(pending[block]) < len(names):
            continue
        fused = pending.pop(block)
        for e in range(t.shape[0]):
            for name, part in expert_tensors(moe, fused, e).items():
                out[f"{block}{moe.experts}.{e}.{name}"] = part.clone(memory_format=torch.contiguous_format)
    return out
