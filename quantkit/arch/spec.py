"""What quantkit knows of a model family: the record every part of quantkit reads.

``table.py`` holds it for the families it names; ``derive.py`` derives it for any other
from the model's own traced forward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

_LLAMA_SUBGROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


@dataclass(frozen=True)
class SmoothMapping:
    """A place where per-channel scales fold away: ``smooth``'s outputs / s, ``balance``'s inputs * s.

    ``smooth`` is a norm (its weight, offset-aware, and bias are divided) or a producer
    linear (its output rows and bias are divided; ``rows(config)`` picks the rows of a fused
    producer, e.g. the v part of Phi3's ``qkv_proj``). ``parent`` is the smallest module
    holding every balance linear: AWQ's search loss is the error of its output. The fold
    checks that the shapes match. ``kv_heads(config) -> (kv heads, head_dim)`` marks the
    smooth channels as value heads: under grouped-query attention each value head feeds
    ``heads / kv_heads`` query heads' columns of ``o_proj``, so one scale per value channel
    multiplies all of its copies (attention is linear in the values).
    """

    smooth: str
    balance: tuple[str, ...]
    parent: str
    rows: Callable[[Any], tuple[int, int]] | None = None
    kv_heads: Callable[[Any], tuple[int, int]] | None = None


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _kv_layout(config) -> tuple[int, int]:
    return config.num_key_value_heads, _head_dim(config)


_LLAMA_MAPPINGS = (
    SmoothMapping("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn"),
    SmoothMapping("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj", kv_heads=_kv_layout),
    SmoothMapping("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
    SmoothMapping("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
)


# Linears that must share one quantization format: serving engines fuse them into one
# matrix (vLLM's qkv_proj and gate_up_proj) and refuse shards with different schemes.
_LLAMA_FUSED = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)


@dataclass(frozen=True)
class ExpertLayout:
    """How a fused experts module holds its per-expert linears, as data.

    transformers' convention (Qwen-, DeepSeek-, GLM-style, Mixtral) is the default: ``gate_up``
    ``[experts, 2 x inter, hidden]`` with the gate rows then the up rows, ``down`` ``[experts,
    hidden, inter]``, no biases. ``transposed``: each expert is stored ``[in, out]`` (gpt-oss:
    ``gate_up`` ``[experts, hidden, 2 x inter]``, ``down`` ``[experts, inter, hidden]``).
    ``interleaved``: gate and up alternate along ``gate_up``'s outputs (gate ``[..., ::2]``, up
    ``[..., 1::2]``). ``bias``: each fused parameter has a ``<name>_bias`` ``[experts, out]``.
    """

    transposed: bool = False
    interleaved: bool = False
    bias: bool = False


@dataclass(frozen=True)
class MoESpec:
    """A sparse mixture-of-experts block, as transformers holds it and as checkpoints name it.

    transformers 5 keeps a block's experts as two fused 3-D parameters of its ``experts``
    module: ``fused[0]`` ``[experts, 2 * inter, hidden]`` (the gate rows, then the up rows)
    and ``fused[1]`` ``[experts, hidden, inter]``. Checkpoints (``save_pretrained``, vLLM's
    MoE loaders) name every expert's linears apart: ``<checkpoint_block>.<experts>.<e>.
    <linears[k]>.weight``, the gate, up and down projections in that order. ``block`` is the
    decoder layer's attribute its forward calls; ``checkpoint_block`` is the block's name on
    disk (Mixtral: ``block_sparse_moe``). The ``router`` (not an ``nn.Linear`` in transformers
    5) stays in the model's dtype and is listed in the checkpoint's ``ignore``; so are the
    block's ``keep`` linears (Qwen2-MoE's ``shared_expert_gate``, one output: a scalar gate).
    A family holding its experts otherwise (gpt-oss) describes them in ``layout`` and
    ``activation``.
    """

    block: str = "mlp"
    checkpoint_block: str = "mlp"
    experts: str = "experts"
    fused: tuple[str, str] = ("gate_up_proj", "down_proj")
    linears: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    router: str = "gate"
    keep: tuple[str, ...] = ()
    # how ``fused`` holds the experts (the same layout in memory and, where a checkpoint stores them
    # fused, on disk)
    layout: ExpertLayout = ExpertLayout()
    # ``activation(fused experts module)`` -> a module combining an expert's gate and up outputs,
    # ``act(gate, up)``; None: the fused module's ``act_fn(gate) * up``
    activation: Callable[[Any], Any] | None = None
    # how the block calls its experts: "top_k" ``(hidden, top_k_index, top_k_weights)``, the sum
    # of each token's top-k experts weighted; "routed_copies" (Llama 4) one ``[experts x tokens,
    # hidden]`` tensor, every token's copy for expert e already scaled by its router score (zero
    # where not routed), each expert's outputs returned in place, which the block sums
    call: str = "top_k"

    @property
    def experts_path(self) -> str:
        """The experts' prefix within a decoder layer, as the checkpoint names it."""
        return f"{self.checkpoint_block}.{self.experts}"

    def expert_of(self, name: str) -> tuple[int, str] | None:
        """``(expert, linear)`` for a layer-relative name like ``mlp.experts.3.down_proj``, else None.

        >>> MoESpec().expert_of("mlp.experts.3.down_proj"), MoESpec().expert_of("self_attn.o_proj")
        ((3, 'down_proj'), None)
        """
        head, sep, rest = name.partition(self.experts_path + ".")
        index, _, leaf = rest.partition(".")
        if head or not sep or not index.isdigit() or leaf not in self.linears:
            return None
        return int(index), leaf

    def kept(self) -> list[str]:
        r"""``ignore`` patterns for the ``keep`` linears of every block.

        >>> print(*MoESpec(keep=("shared_expert_gate",)).kept())
        re:.*\.mlp\.shared_expert_gate$
        """
        return [f"re:.*\\.{re.escape(self.checkpoint_block)}\\.{re.escape(k)}$" for k in self.keep]


@dataclass(frozen=True)
class ArchSpec:
    layers: str = "model.layers"
    subgroups: tuple[tuple[str, ...], ...] = _LLAMA_SUBGROUPS
    # linears of a decoder layer that a mixed-precision plan gives one format (see _LLAMA_FUSED);
    # every other target linear is planned on its own
    fused: tuple[tuple[str, ...], ...] = _LLAMA_FUSED
    # where smoothing / AWQ scales can be folded (SmoothMapping)
    smooth_mappings: tuple[SmoothMapping, ...] = _LLAMA_MAPPINGS
    # the module of a decoder layer that calls the attention function (None: no KV cache to quantize)
    attention: str | None = "self_attn"
    k_proj: str | None = "self_attn.k_proj"
    v_proj: str | None = "self_attn.v_proj"
    # RMSNorm computes x * (offset + weight): Gemma uses 1, so folded scales must account for it.
    norm_weight_offset: float = 0.0
    # Several calibration samples may share a row: the model builds a block-causal mask from
    # position ids that restart at 0 (transformers' packed-sequence masks), so each sample
    # attends only to itself. tests/pipeline/test_packed_calibration.py checks it per architecture.
    packed_calibration: bool = True
    # sparse MoE blocks: their fused experts are unfused into per-expert linears (experts.py)
    moe: MoESpec | None = None
    # the linears whose outputs are added to the residual stream (a residual rotation turns their rows)
    residual_writers: tuple[str, ...] = ("self_attn.o_proj", "mlp.down_proj")
    # why a rotation of the residual stream cannot fold into this architecture's weights ("" if it can)
    residual_rotation_blocked: str = ""
    # linears of a decoder layer kept in the model's dtype and listed in ``ignore`` (routers, scalar gates)
    keep: tuple[str, ...] = ()
    # why the KV cache cannot be quantized where ``attention`` is None
    kv_cache_blocked: str = ""
    # the decoder layers that call attention (None: every layer); a hybrid's others hold a fixed state
    attention_layers: tuple[int, ...] | None = None
    # multi-head latent attention: the width of the latent the engine caches per token and layer
    kv_latent: Callable[[Any], int] | None = None
    # True when derived from the model's traced forward (derive.py) rather than named in table.py
    derived: bool = False

    def kept(self) -> list[str]:
        r"""``ignore`` patterns for the linears kept in the model's dtype in every layer.

        >>> print(*ArchSpec(keep=("mlp.shared_expert_gate",)).kept())
        re:.*\.mlp\.shared_expert_gate$
        """
        own = [f"re:.*\\.{re.escape(k)}$" for k in self.keep]
        return own + (self.moe.kept() if self.moe is not None else [])

    def layer_subgroups(self, names: list[str]) -> list[list[str]]:
        """``subgroups`` restricted to ``names`` (a layer's targets), in true-sequential order.

        Under MoE the experts' input linears (gate, up) of every expert form one sub-group
        and their down projections the next, in expert order: one layer pass each when GPTQ
        re-runs the layer per sub-group. Names no sub-group holds come last, together.
        """
        groups = [[n for n in sg if n in names] for sg in self.subgroups]
        if self.moe is not None:
            experts = sorted((e, self.moe.linears.index(leaf), n) for n in names
                             if (found := self.moe.expert_of(n)) is not None for e, leaf in [found])
            groups.append([n for _, k, n in experts if k < 2])
            groups.append([n for _, k, n in experts if k == 2])
        groups = [g for g in groups if g]
        leftover = [n for n in names if not any(n in g for g in groups)]
        return groups + ([leftover] if leftover else [])




def attention_of(layer, spec: ArchSpec):
    """The decoder layer's attention module (None for a layer without one: a hybrid's
    linear-attention or state-space layer, or a family whose KV cache quantkit does not quantize)."""
    if spec.attention is None:
        return None
    try:
        return layer.get_submodule(spec.attention)
    except AttributeError:
        return None
