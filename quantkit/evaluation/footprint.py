"""What a quantized checkpoint costs where it is served: its weights' type and KV-cache option
read from its ``quantization_config``, and the deployment footprint priced with them."""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.evaluation.attention_cache import attention_cache
from quantkit.serving.memory_account import plan
from quantkit.kv_cache import kv_option
from quantkit.serving.memory_account import WeightFormat

#: the GPU a footprint is priced for when the user names none (``--gpu-mem``): marked as an assumption
ASSUMED_GPU_MEM = "80GiB"


def deployment_footprint(base_dir: Path, cand_dir: Path, gpu_mem: str | None, max_len: int, kv_option=None) -> dict:
    """The deployment footprint with the KV cache evaluated: ``kv_option`` (``--kv``'s first), else
    the checkpoint's own ``kv_cache_scheme`` (FP8 per tensor or per head), else fp16. Priced for the
    GPU ``gpu_mem`` names; without one, for ``ASSUMED_GPU_MEM``, and ``gpu_mem_assumed`` says so
    (the evaluation's own device says nothing about the one the model will be served on)."""

    bits = checkpoint_bits(cand_dir)
    if kv_option is None:
        kv_option = checkpoint_kv(cand_dir)
    fp = plan(base_dir, gpu_mem or ASSUMED_GPU_MEM, max_len, weights=bits, kv="fp16", kv_option=kv_option,
              cache=attention_cache(base_dir)).to_dict()
    fp["gpu_mem_assumed"] = gpu_mem is None
    fp["candidate_bytes_on_disk"] = sum(p.stat().st_size for p in cand_dir.glob("*.safetensors"))
    return fp


def checkpoint_kv(ckpt: Path):
    """The KV option a checkpoint's ``kv_cache_scheme`` deploys (None without one)."""

    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config") or {}
    scheme = cfg.get("kv_cache_scheme")
    if not scheme:
        return None
    return kv_option("fp8-tensor" if scheme.get("strategy") == "tensor" else "fp8-head")


def checkpoint_format(target: Path, group_size: int):
    """The weights of a quantized checkpoint as its ``quantization_config`` says (type, group
    size, symmetry of its first group); a float model's are kept (``WeightFormat()``)."""

    folder = target if target.is_dir() else target.parent
    bits = checkpoint_bits(folder) if (folder / "config.json").exists() else None
    if bits is None:
        return WeightFormat(None, group_size)
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    w = next(iter((qc.get("config_groups") or {}).values()), {}).get("weights") or {}
    return WeightFormat(bits, w.get("group_size") or 0, bool(w.get("symmetric", True)))


def checkpoint_bits(ckpt: Path) -> str | None:
    """The weights' type in the checkpoint's quantization_config (first group), as plan() names it."""
    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config")
    if not cfg:
        return None
    for g in (cfg.get("config_groups") or {}).values():
        w = g.get("weights") or {}
        if w.get("type") == "float" and w.get("num_bits") == 4:
            return "nvfp4" if w.get("strategy") == "tensor_group" else "mxfp4"
        if w.get("type") == "float":
            return "fp8"
        return f"int{w.get('num_bits', 8)}"
    return None
