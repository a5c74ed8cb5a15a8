"""Architecture knowledge, in one table keyed by the Hugging Face class name.

Everything the pipeline and the algorithms need to know about a model family lives here:
where the decoder layers are, the true-sequential order of a layer's linears, which norm
feeds which linears (for smoothing/AWQ scales), and where the attention k/v projections are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from quantkit.errors import QuantkitError

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


def _phi3_v_rows(config) -> tuple[int, int]:
    start = (config.num_attention_heads + config.num_key_value_heads) * _head_dim(config)
    return start, start + config.num_key_value_heads * _head_dim(config)


def _phi3_up_rows(config) -> tuple[int, int]:
    return config.intermediate_size, 2 * config.intermediate_size  # gate_up_proj: [gate; up]


# Linears that must share one quantization format: serving engines fuse them into one
# matrix (vLLM's qkv_proj and gate_up_proj) and refuse shards with different schemes.
_LLAMA_FUSED = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)


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
    """

    block: str = "mlp"
    checkpoint_block: str = "mlp"
    experts: str = "experts"
    fused: tuple[str, str] = ("gate_up_proj", "down_proj")
    linears: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    router: str = "gate"
    keep: tuple[str, ...] = ()

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
    attention: str = "self_attn"
    k_proj: str | None = "self_attn.k_proj"
    v_proj: str | None = "self_attn.v_proj"
    # RMSNorm computes x * (offset + weight): Gemma uses 1, so folded scales must account for it.
    norm_weight_offset: float = 0.0
    # Several calibration samples may share a row: the model builds a block-causal mask from
    # position ids that restart at 0 (transformers' packed-sequence masks), so each sample
    # attends only to itself. tests/test_packed_calibration.py checks it per architecture.
    packed_calibration: bool = True
    # sparse MoE blocks: their fused experts are unfused into per-expert linears (experts.py)
    moe: MoESpec | None = None
    # the linears whose outputs are added to the residual stream (a residual rotation turns their rows)
    residual_writers: tuple[str, ...] = ("self_attn.o_proj", "mlp.down_proj")
    # why a rotation of the residual stream cannot fold into this architecture's weights ("" if it can)
    residual_rotation_blocked: str = ""

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


_GEMMA3 = ArchSpec(
    smooth_mappings=(
        _LLAMA_MAPPINGS[0],
        _LLAMA_MAPPINGS[1],
        SmoothMapping("pre_feedforward_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
        _LLAMA_MAPPINGS[3],
    ),
    norm_weight_offset=1.0,
    residual_rotation_blocked=("its post-attention and post-feedforward norms scale what o_proj and down_proj "
                               "write before the residual add, so a residual rotation cannot fold into the weights"),
)

# Phi3 fuses q/k/v into qkv_proj ([q; k; v] rows) and gate/up into gate_up_proj ([gate; up]).
_PHI3 = ArchSpec(
    subgroups=(("self_attn.qkv_proj",), ("self_attn.o_proj",), ("mlp.gate_up_proj",), ("mlp.down_proj",)),
    smooth_mappings=(
        SmoothMapping("input_layernorm", ("self_attn.qkv_proj",), "self_attn"),
        SmoothMapping("self_attn.qkv_proj", ("self_attn.o_proj",), "self_attn.o_proj", rows=_phi3_v_rows,
                      kv_heads=_kv_layout),
        SmoothMapping("post_attention_layernorm", ("mlp.gate_up_proj",), "mlp"),
        SmoothMapping("mlp.gate_up_proj", ("mlp.down_proj",), "mlp.down_proj", rows=_phi3_up_rows),
    ),
    fused=(),   # already one matrix each
    k_proj=None,
    v_proj=None,
)

# Attention as in Llama; the MLP is a sparse MoE block. AWQ / SmoothQuant fold into the attention
# mappings only: the post-attention norm also feeds the router, whose columns no mapping balances.
_MOE_ATTENTION = _LLAMA_SUBGROUPS[:2]
_MOE_ROTATION = "the router and every expert read the post-attention norm; quantkit rotates dense MLPs only"
_QWEN3_MOE = ArchSpec(subgroups=_MOE_ATTENTION, fused=_LLAMA_FUSED[:1], smooth_mappings=_LLAMA_MAPPINGS[:2],
                      moe=MoESpec(), residual_rotation_blocked=_MOE_ROTATION)
# Qwen2-MoE adds a shared expert (a dense MLP beside the routed experts, scaled by a sigmoid gate)
_QWEN2_MOE = ArchSpec(subgroups=_MOE_ATTENTION + (("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj"),
                                                  ("mlp.shared_expert.down_proj",)),
                      fused=_LLAMA_FUSED[:1], smooth_mappings=_LLAMA_MAPPINGS[:2],
                      moe=MoESpec(keep=("shared_expert_gate",)), residual_rotation_blocked=_MOE_ROTATION)
_MIXTRAL = ArchSpec(subgroups=_MOE_ATTENTION, fused=_LLAMA_FUSED[:1], smooth_mappings=_LLAMA_MAPPINGS[:2],
                    moe=MoESpec(checkpoint_block="block_sparse_moe", linears=("w1", "w3", "w2")),
                    residual_rotation_blocked=_MOE_ROTATION)

ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec(),
    "MistralForCausalLM": ArchSpec(),
    "Qwen2ForCausalLM": ArchSpec(),
    "Qwen3ForCausalLM": ArchSpec(),
    "Gemma3ForCausalLM": _GEMMA3,
    "Phi3ForCausalLM": _PHI3,
    "Qwen2MoeForCausalLM": _QWEN2_MOE,
    "Qwen3MoeForCausalLM": _QWEN3_MOE,
    "MixtralForCausalLM": _MIXTRAL,
}


def arch_for(config, where: str = "config.json") -> tuple[str, ArchSpec]:
    """The architecture spec for a transformers config, or a one-line error."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
    shown = names[0] if names else getattr(config, "model_type", "unknown")
    raise QuantkitError(
        f"{where}: unsupported architecture '{shown}' (supported: {', '.join(ARCHITECTURES)})"
    )
