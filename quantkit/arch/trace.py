"""One forward of the model on the meta device, recorded: what the decoder layers' own code runs.

No weight is read and no number computed: every tensor lives on the meta device, so a 70B
skeleton traces as fast as a tiny one. What is recorded per decoder layer:

- the order in which its linears run, and which of them read the very same input tensor
  (GPTQ's true-sequential sub-groups are exactly that: linears that share an input are
  quantized together, each later group after the earlier ones changed the layer's output);
- which module produced each linear's input, and every operation that read that tensor:
  a norm whose output reaches nothing but a set of linears is a place where per-channel
  scales fold away (smoothing, AWQ);
- a linear whose output reaches another linear only through one elementwise product
  (``down(act(gate(x)) * up(x))``): scales fold from the first linear's rows into the
  second's columns;
- the module that calls the attention function (``scaled_dot_product_attention`` or the
  softmax of eager attention): where the KV cache is read.

Identity is Python object identity of the tensors, held alive for the trace's duration so
that an id is never reused.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from quantkit.errors import QuantkitError

#: Tokens in the traced prompt: enough for any mask or rotary code to take its general path.
TRACE_TOKENS = 8
_ATTENTION_OPS = {"scaled_dot_product_attention", "softmax", "_softmax"}
_PRODUCT_OPS = {"mul", "__mul__", "__rmul__"}


@dataclass
class LayerTrace:
    """What one decoder layer's forward did, names relative to the layer."""

    calls: list[tuple[str, int]] = field(default_factory=list)          # (linear, input tensor id), in order
    producer: dict[int, str] = field(default_factory=dict)              # tensor id -> leaf module that returned it
    readers: dict[int, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))  # id -> (op, module)
    products: dict[int, int] = field(default_factory=dict)              # operand id -> product id (elementwise mul)
    outputs: dict[str, int] = field(default_factory=dict)               # linear -> its output tensor id
    flows: dict[int, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))  # id -> (op, output id)
    attention: str | None = None                                        # module calling the attention op

    def reaches(self, tid: int, ops: set[str], depth: int = 3) -> bool:
        """Whether tensor ``tid`` flows into one of ``ops`` within ``depth`` operations."""
        frontier = {tid}
        for _ in range(depth):
            steps = [(op, out) for t in frontier for op, out in self.flows.get(t, [])]
            if any(op in ops for op, _ in steps):
                return True
            frontier = {out for _, out in steps}
        return False

    def groups(self) -> list[tuple[int, list[str]]]:
        """The linears by shared input, in the order their first member ran: ``(input id, names)``."""
        order: dict[int, list[str]] = {}
        seen = set()
        for name, tid in self.calls:
            if name in seen:
                continue
            seen.add(name)
            order.setdefault(tid, []).append(name)
        return list(order.items())


class _Recorder(TorchFunctionMode):
    """Sees every torch function the layer calls, with the module that is running."""

    def __init__(self, trace: LayerTrace, stack: list[str], keep: list):
        super().__init__()
        self.trace, self.stack, self.keep = trace, stack, keep
        self.active = False

    def start(self) -> None:
        self.active = True
        self.__enter__()

    def stop(self) -> None:
        if self.active:
            self.active = False
            self.__exit__(None, None, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        where = self.stack[-1] if self.stack else ""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for t in tensors:
            self.trace.readers[id(t)].append((name, where))
            if isinstance(out, torch.Tensor):
                self.trace.flows[id(t)].append((name, id(out)))
        # attention scores are [batch, heads, queries, keys]; a router's softmax is 2-D
        if name in _ATTENTION_OPS and self.trace.attention is None and tensors and tensors[0].ndim == 4:
            self.trace.attention = where
        if name in _PRODUCT_OPS and isinstance(out, torch.Tensor) and len(tensors) == 2 \
                and tensors[0].shape == tensors[1].shape == out.shape:
            for t in tensors:
                self.trace.products[id(t)] = id(out)
        self.keep.append(out)
        return out


def _hook_layer(layer: nn.Module, trace: LayerTrace, stack: list[str], keep: list) -> list:
    handles = []
    for name, m in layer.named_modules():
        if not name:
            continue

        def pre(mod, args, name=name, linear=isinstance(m, nn.Linear)):
            stack.append(name)
            if linear and args and isinstance(args[0], torch.Tensor):
                keep.append(args[0])
                trace.calls.append((name, id(args[0])))

        def post(mod, args, out, name=name, leaf=not any(True for _ in m.children())):
            stack.pop()
            if isinstance(out, torch.Tensor):
                keep.append(out)
                if leaf:
                    trace.producer[id(out)] = name
                if isinstance(mod, nn.Linear):
                    trace.outputs[name] = id(out)

        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    return handles


def trace_layers(model: nn.Module, layers: nn.ModuleList) -> list[LayerTrace]:
    """A ``LayerTrace`` per decoder layer, from one forward of ``model`` (meta or real)."""
    traces = [LayerTrace() for _ in layers]
    keep: list = []
    handles, recorders = [], []
    for i, layer in enumerate(layers):
        stack: list[str] = []
        handles += _hook_layer(layer, traces[i], stack, keep)
        recorders.append(recorder := _Recorder(traces[i], stack, keep))
        handles.append(layer.register_forward_pre_hook(lambda mod, args, r=recorder: r.start()))
        handles.append(layer.register_forward_hook(lambda mod, args, out, r=recorder: r.stop()))
    device = next((p.device for p in model.parameters()), torch.device("meta"))
    ids = torch.zeros(1, TRACE_TOKENS, dtype=torch.long, device=device)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    except Exception as e:  # the model's own code; its message is what the user can act on
        raise QuantkitError(f"{type(model).__name__}: its forward cannot be traced on the meta device, so its "
                            f"structure cannot be derived ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    finally:
        for r in reversed(recorders):   # a layer that raised left its mode entered
            r.stop()
        for h in handles:
            h.remove()
    return traces
