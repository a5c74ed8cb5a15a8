"""A transform's changes reach the checkpoint: the written norms are the transformed ones.

The reference is the float source model with the saved transform results re-applied
(``transforms/layer-*.safetensors``) and every quantized linear's weight decoded from the
checkpoint. quantkit.load and transformers + compressed-tensors must both compute it; the
same reference with the source norms instead fails, so the written norms are what matters.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.transforms.fold import fold_scales
from quantkit.arch.table import ARCHITECTURES
from quantkit.formats.compressed_tensors import decompress_module

from arch_configs import tiny_config
from model_factory import random_ids

CASES = {
    "llama-awq": ("LlamaForCausalLM", {"scheme": "W4A16", "group_size": 16, "steps": ["awq", "rtn"]}),
    "gemma3-awq": ("Gemma3ForCausalLM", {"scheme": "W4A16", "group_size": 16, "steps": ["awq", "rtn"]}),
    "llama-smoothquant": ("LlamaForCausalLM", {"scheme": "W8A8", "steps": [{"smoothquant": {"alpha": 0.5}}, "rtn"]}),
}


def _source(arch: str, path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, kv_heads=4), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
            elif p.ndim == 2:
                p.normal_(0.0, 0.05)
    model.save_pretrained(path)
    return path


def _reference(src, out, arch: str, scheme, transformed: bool, levels: float = 127.0):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    spec = ARCHITECTURES[arch]
    log = json.loads((out / "quantization_log.json").read_text())
    with safe_open(out / "model.safetensors", "pt") as f:
        written = {k: f.get_tensor(k) for k in f.keys()}
    for i, layer in enumerate(model.get_submodule(spec.layers)):
        if transformed:
            saved = load_file(out / "transforms" / f"layer-{i:05d}.safetensors")
            for key in log["transforms"][f"{spec.layers}.{i}"]:
                for m in spec.smooth_mappings:
                    s = saved.get(f"{key}.scales.{m.smooth}")
                    if s is not None:
                        fold_scales(layer, m, s, model.config, spec.norm_weight_offset)
        for name, lin in layer.named_modules():
            prefix = f"{spec.layers}.{i}.{name}."
            if isinstance(lin, torch.nn.Linear) and f"{prefix}weight_scale" in written:
                tensors = {k[len(prefix):]: v for k, v in written.items() if k.startswith(prefix)}
                with torch.no_grad():
                    lin.weight.copy_(decompress_module(tensors, scheme, torch.float32))
                if scheme.input_activations is not None:   # W8A8: inputs rounded per token, as served
                    lin.register_forward_pre_hook(functools.partial(_fake_quantize_tokens, levels=levels))
    return model


def _fake_quantize_tokens(module, inputs, levels: float):
    """Per-token int8 rounding with scale absmax / ``levels``: 127 in quantkit's kernels and
    vLLM's, 127.5 in compressed-tensors' fake quantization (range / 255), which transformers runs."""
    x = inputs[0]
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / levels
    return ((x / scale).round().clamp(-128, 127) * scale,)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("case", sorted(CASES))
def test_written_checkpoint_holds_the_transformed_norms(case, tmp_path):
    import compressed_tensors  # noqa: F401
    arch, recipe = CASES[case]
    src = _source(arch, tmp_path / "src")
    q = quantkit.quantize(src, recipe, calibration=random_ids(8, 32, vocab=128))
    out = q.save(tmp_path / "out")
    scheme = quantkit.load_recipe(recipe).groups["group_0"]
    spec = ARCHITECTURES[arch]

    norm = f"{spec.layers}.0.{spec.smooth_mappings[0].smooth}.weight"
    with safe_open(out / "model.safetensors", "pt") as f, safe_open(src / "model.safetensors", "pt") as g:
        assert not torch.allclose(f.get_tensor(norm), g.get_tensor(norm))   # the transform reached the file

    ids = random_ids(2, 12, vocab=128, seed=3)
    reference = _logits(_reference(src, out, arch, scheme, transformed=True), ids)
    assert _rel(_logits(quantkit.load(out, backend="torch"), ids), reference) <= 1e-4
    if scheme.input_activations is not None:
        reference = _logits(_reference(src, out, arch, scheme, transformed=True, levels=127.5), ids)
    assert _rel(_logits(AutoModelForCausalLM.from_pretrained(out), ids), reference) <= 1e-4
    # with the source's norms and producers the same decoded weights compute something else
    untransformed = _logits(_reference(src, out, arch, scheme, transformed=False), ids)
    assert _rel(untransformed, reference) > 1e-2
