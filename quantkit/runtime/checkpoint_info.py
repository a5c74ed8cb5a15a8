"""``quantkit inspect DIR``: what a checkpoint holds, read from its metadata and shard headers."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import parse_quantization_config, scheme_for
from quantkit.inputs.source import SafetensorsSource
from quantkit.kernels import select_backend


def inspect_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    cfg_path = path / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise QuantkitError(f"{cfg_path}: not found") from None
    except json.JSONDecodeError as e:
        raise QuantkitError(f"{cfg_path}: not valid JSON ({e.msg})") from None
    qc = cfg.get("quantization_config")
    if not qc:
        raise QuantkitError(f"{cfg_path}: no quantization_config (not a quantized checkpoint)")
    groups, ignore = parse_quantization_config(qc, str(cfg_path))
    source = SafetensorsSource(path)
    header_sizes = _tensor_sizes(source)
    modules: dict[str, dict[str, Any]] = defaultdict(lambda: {"bytes": 0, "tensors": []})
    for name, size in header_sizes.items():
        mod, _, leaf = name.rpartition(".")
        modules[mod]["bytes"] += size
        modules[mod]["tensors"].append(leaf)
    per_module = {}
    formats = Counter()
    for mod, info in sorted(modules.items()):
        if "weight_packed" in info["tensors"] or "weight_scale" in info["tensors"]:
            s = scheme_for(mod, "Linear", groups, ignore, where=str(cfg_path))
            fmt = s.format if s else "unknown"
            formats[fmt] += 1
            w = s.weights if s else None
            per_module[mod] = {"format": fmt, "bits": w.num_bits if w else None,
                               "strategy": w.strategy if w else None, "group_size": w.group_size if w else None,
                               "bytes": info["bytes"]}
    log = {}
    if (path / "quantization_log.json").exists():
        log = json.loads((path / "quantization_log.json").read_text())

    return {
        "path": str(path),
        "architecture": (cfg.get("architectures") or ["?"])[0],
        "format": qc.get("format"),
        "config_groups": {n: s.to_dict() for n, s in groups.items()},
        "ignore": ignore,
        "kv_cache_scheme": qc.get("kv_cache_scheme"),
        "total_bytes": sum(header_sizes.values()),
        "quantized_bytes": sum(m["bytes"] for m in per_module.values()),
        "modules_by_format": dict(formats),
        "modules": per_module,
        "backend": {"cpu": select_backend("cpu"), "cuda": select_backend("cuda", record=False)},
        "steps": _step_names(log.get("recipe") or {}),
        "moe_coverage": log.get("moe_coverage"),   # tokens per MoE expert in calibration (None: dense)
    }


def _step_names(recipe: dict) -> list[str]:
    """The layer steps a checkpoint was made with (logs before ``steps`` name one ``algorithm``)."""
    if "steps" in recipe:
        return [next(iter(s)) if isinstance(s, dict) else str(s) for s in recipe["steps"]]
    algo = recipe.get("algorithm")
    return [algo.get("name") if isinstance(algo, dict) else algo] if algo else []


def _tensor_sizes(source: SafetensorsSource) -> dict[str, int]:
    out = {}
    for f in sorted(set(source._where.values())):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = v["data_offsets"][1] - v["data_offsets"][0]
    return out
