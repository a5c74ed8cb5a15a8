"""The checkpoint against the model its config describes, from the shards' headers alone.

Checked before any tensor is read or anything written: a config that disagrees with the
shards would otherwise fail deep inside a layer with a long traceback (a shape), cast
integers into weights (a dtype), or drop tensors without a word (layers past the configured
count, names the model has no place for: the pipeline writes what the model it builds holds).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn
from quantkit.arch.lookup import arch_for
from quantkit.pipeline.named_source import named_as_modules
from quantkit.pipeline.onload import build_skeleton
from quantkit.errors import QuantkitError

#: Tensors transformers recomputes from the config; older checkpoints saved them in each layer.
COMPUTED_SUFFIXES = (".rotary_emb.inv_freq",)


def check_checkpoint(config, source, config_file: str, warn: Callable[[str], None]) -> None:
    """``check_layout`` against the skeleton built from ``config`` (its architecture must be supported)."""

    _, spec = arch_for(config)
    model = build_skeleton(config)
    check_layout(model, spec.layers, config, named_as_modules(model, source), config_file, warn)


def check_layout(model: nn.Module, layers_path: str, config, source, config_file: str,
                 warn: Callable[[str], None]) -> None:
    """Refuse (``QuantkitError``) a stored tensor whose shape or dtype is not the one ``model``
    (the skeleton built from ``config``) has, layers past the configured count, and a tensor
    under ``layers_path`` the model has no place for; warn about computed buffers not written."""

    params = dict(model.named_parameters(remove_duplicate=False))
    _check_head(model, params, config, source, config_file)
    for name, p in params.items():
        if name in source:
            fault = tensor_fault(name, p, *source.describe(name), config_file)
            if fault is not None:
                raise QuantkitError(f"{source.where(name)}: {fault}")
    keys = list(source.keys())
    num_layers = len(model.get_submodule(layers_path))
    extra = excess_layers(keys, layers_path, num_layers)
    if extra:
        key = config.attribute_map.get("num_hidden_layers", "num_hidden_layers")
        first = min(k for k in keys if layer_index(k, layers_path) == extra[0])
        raise QuantkitError(f"{config_file}: {key} is {num_layers}, but {source.where(first)} holds "
                            f"{extra[-1] + 1} layers ({layers_path}.0 to {layers_path}.{extra[-1]}); the layers past "
                            f"{num_layers} would be dropped")
    buffers = {n for n, _ in model.named_buffers()}
    dropped, computed = unplaced(keys, layers_path, set(params), buffers)
    if dropped:
        more = f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else ""
        raise QuantkitError(f"{source.where(dropped[0])}: tensor '{dropped[0]}'{more} has no place in the model "
                            f"{config_file} describes; it would be dropped from the checkpoint")
    if computed:
        warn(f"{source.where(computed[0])}: {len(computed)} tensor{'s' if len(computed) > 1 else ''} the model "
             f"computes from its config (e.g. '{computed[0]}') not written")


def _check_head(model: nn.Module, params: dict, config, source, config_file: str) -> None:
    """An untied output head must be in the checkpoint: without it the converted model would
    have none (transformers would draw one at random), which the evaluation then refuses."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # a vision-language wrapper's flag and its text config's may disagree: transformers follows the wrapper's
    text = getattr(config, "text_config", None) or config
    tie = getattr(config, "tie_word_embeddings", None)
    if head is None or (tie if tie is not None else getattr(text, "tie_word_embeddings", False)):
        return
    name = next((n for n, p in params.items() if p is head.weight), None)
    if name is not None and name not in source:
        raise QuantkitError(f"{config_file}: tie_word_embeddings is false, but the checkpoint has no '{name}': "
                            "the model would be written without its output head")


def tensor_fault(name: str, expected: torch.Tensor, dtype: "torch.dtype | str", shape: tuple[int, ...],
                 config_file: str) -> str | None:
    """What is wrong with a stored tensor ``name`` of ``dtype`` and ``shape`` where the model
    has ``expected`` (a meta parameter), or None."""
    if expected.is_floating_point() and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        shown = str(dtype).removeprefix("torch.")
        return (f"tensor '{name}' has dtype {shown}, where the model has a floating-point weight; "
                "quantkit does not cast integer tensors into weights")
    if tuple(shape) != tuple(expected.shape):
        return (f"tensor '{name}' has shape {_shape(shape)} on disk, but {config_file} implies "
                f"{_shape(expected.shape)}")
    return None


def layer_index(key: str, layers_path: str) -> int | None:
    """The decoder layer ``key`` belongs to (``<layers_path>.<i>.…``), or None."""
    prefix = layers_path + "."
    if not key.startswith(prefix):
        return None
    head = key[len(prefix):].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def excess_layers(keys: Iterable[str], layers_path: str, num_layers: int) -> list[int]:
    """The layer indices found in ``keys`` at or past ``num_layers``, ascending."""
    found = {layer_index(k, layers_path) for k in keys}
    return sorted(i for i in found if i is not None and i >= num_layers)


def unplaced(keys: Iterable[str], layers_path: str, params: set[str],
             buffers: set[str]) -> tuple[list[str], list[str]]:
    """The keys under ``layers_path`` that are neither a parameter nor a stored buffer of the model:
    (those that would be lost, those it computes itself: ``COMPUTED_SUFFIXES``), each sorted."""
    dropped, computed = [], []
    for k in sorted(keys):
        if not k.startswith(layers_path + ".") or k in params or (k in buffers and not k.endswith(COMPUTED_SUFFIXES)):
            continue   # a stored buffer of the model is written back as read
        (computed if k.endswith(COMPUTED_SUFFIXES) else dropped).append(k)
    return dropped, computed


def _shape(shape: Iterable[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"
