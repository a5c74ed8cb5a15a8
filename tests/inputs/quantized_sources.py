"""Sources that arrive quantized, built in the tests from tiny random models: a Llama whose
linears are FP8 with 128 x 128 block scales (DeepSeek-V3's layout, edge blocks partial), and a
gpt-oss whose experts are MXFP4 blocks and scales (its released layout)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantkit.numerics.e8m0 import scale_exponent
from quantkit.numerics.fp4_numerics import round_to_e2m1

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
MXFP4_CONFIG = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}


def fp8_block(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, float32 scale_inv)``: each block's scale its absolute maximum over 448."""
    rows, cols = w.shape
    padded = torch.zeros(math.ceil(rows / block) * block, math.ceil(cols / block) * block)
    padded[:rows, :cols] = w
    blocks = padded.reshape(padded.shape[0] // block, block, padded.shape[1] // block, block)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448).clamp(min=1e-12)
    full = scale.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return (w / full).to(torch.float8_e4m3fn), scale


def fp8_block_reference(q: torch.Tensor, scale_inv: torch.Tensor, block: int = 128) -> torch.Tensor:
    """The slow obvious dequantization: block by block, edges partial."""
    out = torch.empty(q.shape)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            rows, cols = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            out[rows, cols] = q[rows, cols].to(torch.float32) * scale_inv[i, j]
    return out


def save_fp8_block_source(float_dir: Path, out: Path) -> Path:
    """``float_dir``'s decoder-layer linears as FP8 block weights with ``weight_scale_inv``."""
    tensors = {}
    for k, v in load_file(str(float_dir / "model.safetensors")).items():
        if ".layers." in k and k.endswith(("proj.weight", "proj_with_mqa.weight")):
            tensors[k], tensors[k + "_scale_inv"] = fp8_block(v)
        else:
            tensors[k] = v
    return _save(float_dir, out, tensors, FP8_CONFIG)


def save_dequantized(quantized_dir: Path, out: Path) -> Path:
    """The plain float model an FP8 block source stands for (the reference dequantization)."""
    stored = load_file(str(quantized_dir / "model.safetensors"))
    tensors = {k: fp8_block_reference(v, stored[k + "_scale_inv"]) if v.dtype == torch.float8_e4m3fn else v
               for k, v in stored.items() if not k.endswith("_scale_inv")}
    return _save(quantized_dir, out, tensors, None)


def mxfp4_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's ``(blocks, scales)`` of an experts weight ``[E, in, rows]`` (transformers' layout):
    blocks ``[E, rows, in / 32, 16]`` (low nibble the even value), E8M0 scales ``[E, rows, in / 32]``."""
    t = w.transpose(1, 2)
    groups = t.reshape(*t.shape[:2], t.shape[2] // 32, 32)
    exponent = scale_exponent(groups.abs().amax(-1), emax=2)
    codes = round_to_e2m1(groups / torch.pow(2.0, exponent.float() - 127).unsqueeze(-1))
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous(), exponent.contiguous()


def save_mxfp4_source(float_dir: Path, out: Path) -> Path:
    tensors = {}
    for k, v in load_file(str(float_dir / "model.safetensors")).items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[k + "_blocks"], tensors[k + "_scales"] = mxfp4_experts(v)
        else:
            tensors[k] = v
    return _save(float_dir, out, tensors, MXFP4_CONFIG)


def make_gpt_oss_dir(path: Path, seed: int = 0) -> Path:
    """A random gpt-oss: hidden 96 and 2 x intermediate 128, so a transposed expert shows."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    cfg = GptOssConfig(vocab_size=260, hidden_size=96, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=32, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=16, max_position_embeddings=256,
                       layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.05)
    model.save_pretrained(path)
    return path


def _save(like: Path, out: Path, tensors: dict, quantization_config: dict | None) -> Path:
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((like / "config.json").read_text())
    config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for side in like.glob("tokenizer*"):
        (out / side.name).write_bytes(side.read_bytes())
    return out
