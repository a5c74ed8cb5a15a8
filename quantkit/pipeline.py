"""The layer-by-layer runner: capture inputs, onload, quantize, propagate, pack, write, free.

Memory stays flat in model depth: only the embeddings, one decoder layer and the captured
hidden states of the calibration set are resident at any time; every other weight is read
from the safetensors shards when its layer comes up and dropped when the layer is written.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .algorithms import LayerContext, QuantizedWeight, build_algorithm
from .arch import ArchSpec, arch_for
from .errors import QuantkitError
from .formats.compressed_tensors import compress_module, quantization_config, scheme_for
from .formats.writer import ShardWriter
from .interleave import Interleaver
from .primitives import calculate_qparams
from .recipe import Recipe
from .scheme import QuantScheme


@dataclass
class PipelineResult:
    path: Path
    bytes_before: int
    bytes_after: int
    seconds: float
    peak_rss_bytes: int
    num_quantized: int
    num_layers: int
    module_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _get(root: nn.Module, path: str) -> nn.Module:
    m = root
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)
    return m


def build_skeleton(config) -> nn.Module:
    """The model with parameters on the meta device and real (computed) buffers."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=_config_dtype(config))
    return model.eval()


def _config_dtype(config) -> torch.dtype:
    d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(d, str):
        d = getattr(torch, d)
    return d


def _materialize(module: nn.Module, prefix: str, source, device: str = "cpu") -> None:
    """Load a module's parameters (those stored in the checkpoint) from the source."""
    state = {}
    for name, p in module.named_parameters(recurse=True):
        state[name] = source.get(f"{prefix}{name}").to(device=device, dtype=p.dtype)
    for name, b in module.named_buffers(recurse=True):
        key = f"{prefix}{name}"
        if key in source:
            state[name] = source.get(key).to(device)
    module.load_state_dict(state, strict=False, assign=True)


def _dematerialize(module: nn.Module) -> None:
    for name, p in list(module.named_parameters(recurse=True)):
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        leaf = name.rsplit(".", 1)[-1]
        setattr(owner, leaf, nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False))


class _Recorder(nn.Module):
    """Stands in for a decoder layer while capturing: records its call, passes input through."""

    def __init__(self, layer: nn.Module, calls: list):
        super().__init__()
        self.calls = calls
        for attr in ("attention_type", "is_sliding", "sliding_window", "layer_idx"):
            if hasattr(layer, attr):
                setattr(self, attr, getattr(layer, attr))

    def forward(self, hidden_states, *args, **kwargs):
        self.calls.append((args, kwargs))
        return hidden_states


def _layer_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@dataclass
class CalibrationChunk:
    """Calibration rows that run through a layer in one call.

    ``valid`` marks the positions holding sample tokens (None: all of them); the rest is
    padding at row ends, excluded from every statistic. ``position_ids`` restart at 0 at
    each sample, so packed samples do not attend to each other.
    """

    input_ids: torch.Tensor                 # [rows, row_len]
    position_ids: torch.Tensor | None
    valid: torch.Tensor | None              # [rows, row_len] bool

    @property
    def num_tokens(self) -> int:
        return int(self.valid.sum()) if self.valid is not None else self.input_ids.numel()


def pack_rows(lengths: list[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: the sample indices of each row, each row's lengths summing to <= row_len."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if n > row_len:
            raise ValueError(f"sample {i} has {n} tokens, more than the row length {row_len}")
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_len - n)
    return rows


def make_chunks(samples: list[list[int]], batch_tokens: int, packed: bool = True) -> list[CalibrationChunk]:
    """Calibration samples as batches of at most ``batch_tokens`` positions (at least one row).

    ``packed``: samples share rows of the longest sample's length, position ids restarting
    at each sample. Otherwise each row holds one sample and a batch holds samples of one
    length (no padding, no packing).
    """
    lengths = [len(s) for s in samples]
    if any(n == 0 for n in lengths):
        raise QuantkitError("calibration: a sample has no tokens")
    chunks: list[CalibrationChunk] = []
    if not packed:
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            by_len.setdefault(n, []).append(i)
        for n, idx in sorted(by_len.items(), reverse=True):
            per = max(1, batch_tokens // n)
            for k in range(0, len(idx), per):
                ids = torch.tensor([samples[i] for i in idx[k:k + per]], dtype=torch.long)
                chunks.append(CalibrationChunk(ids, None, None))
        return chunks
    row_len = max(lengths)
    rows = pack_rows(lengths, row_len)
    per = max(1, batch_tokens // row_len)
    for k in range(0, len(rows), per):
        block = rows[k:k + per]
        ids = torch.zeros(len(block), row_len, dtype=torch.long)
        pos = torch.zeros(len(block), row_len, dtype=torch.long)
        valid = torch.zeros(len(block), row_len, dtype=torch.bool)
        for r, members in enumerate(block):
            at = 0
            for i in members:
                n = lengths[i]
                ids[r, at:at + n] = torch.tensor(samples[i], dtype=torch.long)
                pos[r, at:at + n] = torch.arange(n)
                valid[r, at:at + n] = True
                at += n
            # the tail is its own short "sample" of token 0: it attends only to itself
            pos[r, at:] = torch.arange(row_len - at)
        chunks.append(CalibrationChunk(ids, pos, None if bool(valid.all()) else valid))
    return chunks


#: Positions per calibration batch (at least one row). The whole set still runs as one pass
#: when it fits ``calibration.batch_tokens`` (quantkit.interleave); batches of this size keep
#: the layer's element-wise work in the CPU caches (measured in quantkit/interleave.py).
MICRO_BATCH_TOKENS = 4096


def auto_batch_tokens(config, device: str) -> int:
    """Positions per calibration batch: what fits a quarter of the free memory in one layer call."""
    d = int(getattr(config, "hidden_size", 4096))
    inter = int(getattr(config, "intermediate_size", 4 * d) or 4 * d)
    elt = torch.empty(0, dtype=_config_dtype(config)).element_size()
    # the layer's input and output, norms, q/k/v/attention output, MLP intermediates, and
    # the fp32 copy a Hessian accumulation makes of the widest input
    per_token = elt * (8 * d + 4 * inter) + 4 * max(d, inter)
    if str(device).startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device))
    else:
        import psutil

        free = psutil.virtual_memory().available
    return max(1, int(free * 0.25) // per_token)


class ActivationStore:
    """The hidden states entering the current layer, one tensor per calibration batch.

    In memory, or (``folder`` given) in safetensors files there, so that only the batch
    being run is resident: for models whose calibration activations do not fit in memory.
    ``put_next`` records a batch's output; ``advance`` makes the outputs the next inputs.
    """

    def __init__(self, first: list[torch.Tensor], folder: Path | None = None, device: str = "cpu"):
        self.folder, self.device, self.generation = folder, device, 0
        self._mem: list[torch.Tensor | None] = []
        self._next: dict[int, torch.Tensor] = {}
        self.count = len(first)
        for j, t in enumerate(first):
            self._write(0, j, t)

    def _file(self, generation: int, j: int) -> Path:
        return self.folder / f"hidden-{generation % 2}-{j:06d}.safetensors"

    def _write(self, generation: int, j: int, t: torch.Tensor) -> None:
        if self.folder is None:
            if generation == self.generation:
                self._mem.append(t)
            else:
                self._next[j] = t
            return
        from safetensors.torch import save_file

        save_file({"hidden": t.detach().contiguous().cpu()}, str(self._file(generation, j)))

    def get(self, j: int) -> torch.Tensor:
        if self.folder is None:
            return self._mem[j]
        from safetensors.torch import load_file

        return load_file(str(self._file(self.generation, j)), device=str(self.device))["hidden"]

    def put_next(self, j: int, t: torch.Tensor) -> None:
        self._write(self.generation + 1, j, t)

    def advance(self) -> None:
        if self.folder is None:
            if len(self._next) != self.count:
                raise RuntimeError(f"{self.count - len(self._next)} calibration batches have no output")
            self._mem = [self._next[j] for j in range(self.count)]
            self._next = {}
        self.generation += 1


def capture_inputs(model: nn.Module, layers_path: str, chunks: list[CalibrationChunk], device: str):
    """Hidden states entering layer 0 and each layer's call arguments, per chunk."""
    layers = _get(model, layers_path)
    originals = list(layers)
    calls: list[list] = [[] for _ in originals]
    for i, layer in enumerate(originals):
        layers[i] = _Recorder(layer, calls[i])
    base = _get(model, layers_path.rsplit(".", 1)[0])
    hidden = []
    hook = layers[0].register_forward_pre_hook(lambda m, a, kw: hidden.append(a[0] if a else kw["hidden_states"]), with_kwargs=True)
    try:
        with torch.no_grad():
            for c in chunks:
                kw = {} if c.position_ids is None else {"position_ids": c.position_ids.to(device)}
                base(input_ids=c.input_ids.to(device), use_cache=False, **kw)
    finally:
        hook.remove()
        for i, layer in enumerate(originals):
            layers[i] = layer
    per_layer_kwargs = [[kw for _, kw in c] for c in calls]
    per_layer_args = [[a for a, _ in c] for c in calls]
    return hidden, per_layer_args, per_layer_kwargs


def _token_selector(state: dict, where: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``tokens(x)`` for the chunk now running: its real tokens as ``[n, features]``."""
    def tokens(x: torch.Tensor) -> torch.Tensor:
        valid = state.get("valid")
        if valid is None:
            return x.reshape(-1, x.shape[-1])
        if tuple(x.shape[:-1]) != tuple(valid.shape):
            raise QuantkitError(f"{where}: a linear's input has shape {tuple(x.shape)}, not [rows, row_len, features] "
                                f"{tuple(valid.shape)}: cannot tell calibration tokens from padding")
        return x[valid.to(x.device)]
    return tokens


def _targets(layer: nn.Module, prefix: str, recipe: Recipe) -> dict[str, tuple[nn.Linear, QuantScheme]]:
    out = {}
    for name, m in layer.named_modules():
        if isinstance(m, nn.Linear):
            s = scheme_for(f"{prefix}{name}", "Linear", recipe.groups, list(recipe.ignore))
            if s is not None:
                out[name] = (m, s)
    return out


def _check_widths(model: nn.Module, layers_path: str, recipe: Recipe) -> None:
    layers = _get(model, layers_path)
    for i, layer in enumerate(layers):
        prefix = f"{layers_path}.{i}."
        for name, (m, s) in _targets(layer, prefix, recipe).items():
            group = next(g for g, sc in recipe.groups.items() if sc is s)
            s.weights.check_width(m.in_features, f"config_groups.{group}.weights ({prefix}{name})")


def run_pipeline(config, source, recipe: Recipe, samples: list[list[int]] | None, writer: ShardWriter,
                 device: str = "cpu", progress: Callable[[Iterable, int], Iterable] | None = None,
                 log: Callable[[str], None] | None = None) -> PipelineResult:
    """Quantize the model described by ``config`` whose tensors come from ``source``."""
    t0 = time.time()
    arch_name, spec = arch_for(config)
    model = build_skeleton(config)
    layers = _get(model, spec.layers)
    _check_widths(model, spec.layers, recipe)
    algorithm = build_algorithm(recipe.algorithm, recipe.algorithm_options)
    needs_data = recipe.needs_calibration
    if needs_data and not samples:
        raise QuantkitError("calibration: this recipe needs calibration data (algorithm or static activations)")

    # Non-layer tensors (embeddings, final norm, lm_head): copied unchanged.
    layer_prefix = spec.layers + "."
    outer = [k for k in source.keys() if not k.startswith(layer_prefix)]
    for k in outer:
        writer.add(k, source.get(k))
        writer.end_unit()  # embeddings can be GBs: do not hold several at once
    source.release()
    hidden = args_per_layer = kwargs_per_layer = None
    offload_dir: Path | None = None
    chunks: list[CalibrationChunk] = []
    single_pass = False
    interleaver = Interleaver()
    if needs_data:
        outer_modules = [n for n, _ in model.named_parameters() if not n.startswith(layer_prefix)]
        state = {n: source.get(n) for n in outer_modules if n in source}
        model.load_state_dict(state, strict=False, assign=True)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        batch_tokens = recipe.calibration.batch_tokens or auto_batch_tokens(config, device)
        chunks = make_chunks(samples, min(batch_tokens, MICRO_BATCH_TOKENS), packed=spec.packed_calibration)
        # the whole set in memory at once: an interleaved pass can run (LayerContext)
        single_pass = sum(c.input_ids.numel() for c in chunks) <= batch_tokens
        if log is not None:
            rows = sum(c.input_ids.shape[0] for c in chunks)
            log(f"calibration: {len(samples)} samples, {num_tokens_of(samples)} tokens in {rows} rows, "
                f"{len(chunks)} batch{'es' if len(chunks) > 1 else ''} per layer"
                f"{', all in one pass' if single_pass else ''}")
        first, args_per_layer, kwargs_per_layer = capture_inputs(model, spec.layers, chunks, device)
        if recipe.calibration.offload:
            offload_dir = Path(tempfile.mkdtemp(prefix=".quantkit-activations-", dir=writer.tmp.parent))
        hidden = ActivationStore(first, offload_dir, device)
        del first
    stats: dict[str, dict[str, Any]] = {}
    groups_used: dict[str, QuantScheme] = {}
    formats: dict[str, int] = {}
    num_tokens = num_tokens_of(samples)
    iterator = range(len(layers))
    if progress is not None:
        iterator = progress(iterator, len(layers))
    try:
        for i in iterator:
            layer = layers[i]
            prefix = f"{spec.layers}.{i}."
            _materialize(layer, prefix, source, device)
            targets = _targets(layer, prefix, recipe)
            for _, (_, s) in targets.items():
                for g, sc in recipe.groups.items():
                    if sc is s:
                        groups_used[g] = s
            observed: dict[str, torch.Tensor] = {}
            running: dict[str, Any] = {"valid": None}
            tokens = _token_selector(running, prefix[:-1])

            def observe_static_inputs(_targets=targets) -> list:
                """Hooks recording each static-activation linear's input absmax over real tokens."""
                observed.clear()
                hooks = []
                for name, (m, s) in _targets.items():
                    a = s.input_activations
                    if a is not None and not a.dynamic:
                        def observe(mod, inp, _name=name):
                            v = tokens(inp[0].detach()).abs().amax().float()
                            observed[_name] = torch.maximum(observed.get(_name, v), v)
                        hooks.append(m.register_forward_pre_hook(observe))
                return hooks

            def run_layer(propagate: bool = False, interleaved: bool = False, _layer=layer, _i=i):
                hooks = observe_static_inputs() if propagate else []

                def call(j: int) -> None:
                    out = _layer_output(_layer(hidden.get(j), *args_per_layer[_i][j], **kwargs_per_layer[_i][j]))
                    if propagate:
                        hidden.put_next(j, out)

                def select(j: int) -> None:
                    running["valid"] = chunks[j].valid

                try:
                    with torch.no_grad():
                        if interleaved:
                            interleaver.run([functools.partial(call, j) for j in range(hidden.count)], before=select)
                        else:
                            for j in range(hidden.count):
                                select(j)
                                call(j)
                finally:
                    running["valid"] = None
                    for hk in hooks:
                        hk.remove()

            subgroups = [[n for n in sg if n in targets] for sg in spec.subgroups]
            subgroups = [sg for sg in subgroups if sg]
            leftover = [n for n in targets if not any(n in sg for sg in subgroups)]
            if leftover:
                subgroups.append(leftover)
            ctx = LayerContext(i, prefix[:-1], layer, targets, subgroups,
                               run=run_layer if needs_data else _no_data,
                               num_samples=len(samples or []), num_tokens=num_tokens,
                               single_pass=single_pass, tokens=tokens, sync=interleaver.sync,
                               batch_index=interleaver.current)
            results = algorithm.quantize_layer(ctx)
            missing = set(targets) - set(results)
            if missing:
                raise RuntimeError(f"{recipe.algorithm} returned no result for {sorted(missing)}")
            # Write the quantized weights back so this layer's outputs (next layer's inputs) are
            # those of the quantized model.
            for name, (m, s) in targets.items():
                m.weight.data = results[name].dequantized(s.weights, m.weight.dtype)
            if needs_data:
                if not ctx.propagated:
                    # the algorithm's passes ran on other weights: one more with the final ones
                    run_layer(propagate=True)
                hidden.advance()
            # Pack and write every tensor of the layer.
            written = set()
            for name, (m, s) in targets.items():
                r = results[name]
                input_scale = None
                if name in observed:
                    amax = observed[name].reshape(1)
                    input_scale, _ = calculate_qparams(-amax, amax, s.input_activations, dtype=m.weight.dtype)
                tensors = compress_module(r.q, r.scale, r.zero_point, r.g_idx, s, m.bias, input_scale)
                for k, t in tensors.items():
                    writer.add(f"{prefix}{name}.{k}", t)
                written.update({f"{name}.weight", f"{name}.bias"})
                stats[f"{prefix}{name}"] = {"format": s.format, **r.stats}
                formats[s.format] = formats.get(s.format, 0) + 1
            for pname, p in layer.named_parameters():
                if pname not in written:
                    writer.add(f"{prefix}{pname}", source.get(f"{prefix}{pname}"))
            _dematerialize(layer)
            del results, targets, ctx
            writer.end_unit()
            source.release()
            gc.collect(1)  # tensors go by reference counting; a full collection costs ~0.2 s a layer

    finally:
        if offload_dir is not None:
            shutil.rmtree(offload_dir, ignore_errors=True)

    ignore = _ignored_linears(model, recipe)
    qc = quantization_config(groups_used or recipe.groups, ignore)
    cfg = config.to_dict()
    cfg["quantization_config"] = qc
    writer.write_json("config.json", cfg)
    writer.write_json("quantization_log.json", {
        "quantkit_version": _version(), "recipe": recipe.to_dict(), "architecture": arch_name,
        "calibration": {"num_samples": len(samples or []), "num_tokens": num_tokens},
        "modules": stats,
    })
    writer.finalize()
    return PipelineResult(writer.tmp, source.nbytes(), writer.total_bytes, time.time() - t0,
                          peak_rss_bytes(), len(stats), len(layers), stats, formats)


def num_tokens_of(samples: list[list[int]] | None) -> int:
    return sum(len(s) for s in samples) if samples else 0


def _no_data(propagate: bool = False, interleaved: bool = False) -> None:
    raise QuantkitError("calibration: this algorithm ran the layer but no calibration data was captured")


def _ignored_linears(model: nn.Module, recipe: Recipe) -> list[str]:
    names = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and scheme_for(name, "Linear", recipe.groups, list(recipe.ignore)) is None:
            names.append(name)
    return names


def _version() -> str:
    from . import __version__

    return __version__
