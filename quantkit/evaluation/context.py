"""How far the long-context slices reach, and what the report says about it.

The deployment length (``max_len``) is ``--max-len``, else the recipe's ``eval: max_len:``, else
the baseline's ``max_position_embeddings`` (the longest context it serves). The long slices run
windows of that length, unless one window would not fit in this machine's free memory: then the
longest window that does, and a warning says so. A text longer than the window is cut at it (the
report says how many of its tokens were left out); a window longer than every text leaves its
deepest positions unmeasured, and a warning names them: a KV-cache error that grows with position
would go unseen there.

Example:
    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
    ...                   max_position_embeddings=8192)
    >>> window_bytes(cfg, 8192, "sdpa") < window_bytes(cfg, 8192, "eager")
    True
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from quantkit.pipeline.memory import available_memory

DEFAULT_MAX_LEN = 4096      # a model whose config does not say how long a context it serves
MEMORY_SHARE = 0.7          # of the free memory, one window's forward may take
# float32 activations a token holds in one layer's forward, in units of hidden / intermediate
# size: residual, norm, q/k/v/o and their rotary copies (~12 hidden), gate, up and their product
# (~4 intermediate), x2 for the allocator's slack; measured: SmolLM2 at 8192 tokens, sdpa,
# 0.8 GB over the weights, this gives 0.9 GB
PER_TOKEN_HIDDEN, PER_TOKEN_INTERMEDIATE, SLACK = 12, 4, 2


def deployment_length(model, max_len: int | None) -> tuple[int, str]:
    """``max_len`` when given (its source is the caller's), else the model's own limit."""
    if max_len is not None:
        return max_len, "given"
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit:
        return int(limit), "the model's max_position_embeddings"
    return DEFAULT_MAX_LEN, f"default ({DEFAULT_MAX_LEN}: the model's config gives no max_position_embeddings)"


def window_bytes(config, tokens: int, attention: str | None = None) -> int:
    """Peak bytes of one model's forward over one window of ``tokens`` (batch 1, float32),
    beyond its weights. "eager" attention builds ``[heads, T, T]`` scores a layer; sdpa does not,
    but a sliding-window model hands it a ``[T, T]`` mask."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, inter = text.hidden_size, getattr(text, "intermediate_size", 4 * text.hidden_size)
    linear = tokens * 4 * (PER_TOKEN_HIDDEN * hidden + PER_TOKEN_INTERMEDIATE * inter)
    attention = attention or getattr(config, "_attn_implementation", None) or "eager"
    if attention.endswith("eager"):
        square = text.num_attention_heads * tokens * tokens * 4
    else:
        square = tokens * tokens * 4 if getattr(text, "sliding_window", None) else 0
    return SLACK * linear + square


def free_bytes() -> int:
    """The host's available memory, or less under a cgroup cap (a container's limit)."""
    return available_memory()


def affordable_window(config, max_len: int, free: int) -> int:
    """The longest window up to ``max_len`` (``max_len``, else a power of two) that fits in
    ``MEMORY_SHARE`` of ``free`` bytes.

    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4)
    >>> affordable_window(cfg, 4096, free=2**40), affordable_window(cfg, 4096, free=2**27)
    (4096, 2048)
    """
    budget = MEMORY_SHARE * free
    if window_bytes(config, max_len) <= budget:
        return max_len
    w = 1 << (max_len.bit_length() - 1)
    while w > 16 and window_bytes(config, w) > budget:
        w //= 2
    return w


@dataclass
class Reach:
    """The deployment length, the long slices' window, and what each long slice's texts covered."""
    max_len: int
    source: str
    window: int
    window_gib: float                               # estimated for a window of max_len tokens
    free_gib: float
    slices: dict[str, dict] = field(default_factory=dict)
    # why the window is shorter than max_len, when it is: this machine's memory, or the engine
    # (a served prompt plus one output token must fit its max_model_len)
    limited_by: str = "memory"

    def to_dict(self) -> dict:
        return asdict(self)

    def record(self, name: str, text_tokens: list[int], deepest: int) -> list[str]:
        """Note what a long slice's texts covered; returns its warnings. ``deepest`` is the longest
        context any of its tokens was predicted from."""
        cut = [n for n in text_tokens if n > self.window]
        self.slices[name] = {"texts": len(text_tokens), "text_tokens": text_tokens, "deepest": deepest,
                             "cut": len(cut), "tokens_left_out": sum(n - self.window for n in cut)}
        if deepest + 1 < self.window:
            return [f"{name}: its longest text holds {max(text_tokens)} tokens: positions {deepest + 1}-"
                    f"{self.max_len} of the deployment length {self.max_len} ({self.source}) are not measured "
                    "(a KV-cache error growing with position would not show there); add longer texts"]
        return []

    def notes(self) -> list[str]:
        """One sentence per long slice, and one for a window shorter than the deployment length."""
        out = []
        if self.window < self.max_len and self.limited_by == "engine":
            out.append(f"Windows held {self.window} tokens, not the deployment length {self.max_len}: the engine "
                       "takes a prompt only when it and one output token fit its max_model_len.")
        elif self.window < self.max_len:
            out.append(f"Long slices ran windows of {self.window} tokens, not the deployment length {self.max_len}: "
                       f"one window of {self.max_len} needs about {self.window_gib:.1f} GiB, {self.free_gib:.1f} GiB free.")
        for name, s in self.slices.items():
            cut = (f"; {s['cut']} text(s) longer than the window were cut at {self.window} tokens "
                   f"({s['tokens_left_out']} tokens left out)" if s["cut"] else "")
            out.append(f"{name}: {s['texts']} text(s) of {', '.join(map(str, s['text_tokens']))} tokens, measured "
                       f"to a context of {s['deepest']} tokens (deployment length {self.max_len}, {self.source}){cut}.")
        return out


def plan_reach(model, max_len: int | None, source: str | None = None, free: int | None = None) -> Reach:
    """The deployment length and the window the long slices can afford on this machine."""
    length, default_source = deployment_length(model, max_len)
    free = free_bytes() if free is None else free
    config = model.config
    need = window_bytes(config, length)
    window = affordable_window(config, length, free)
    return Reach(length, source or default_source, window, need / 2**30, free / 2**30)
