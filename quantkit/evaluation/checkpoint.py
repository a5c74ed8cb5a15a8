"""Paths -> models: the baseline from a model folder, the candidate through quantkit's
packed inference path (``quantkit.load``) when the folder is a quantized checkpoint, and
the per-module error the algorithm recorded in ``quantization_log.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

from quantkit.arch.meta import auto_class
from quantkit.errors import QuantkitError
from quantkit.inputs.model_folder import check_links
from quantkit.inputs.embedded_model import default_model_dir
from quantkit.inputs.source import SafetensorsSource
from quantkit.runtime.dequantized import is_quantized_source, load_dequantized
from quantkit.runtime.loader import load


def resolve_dir(model: str | Path | None) -> Path:
    if model in (None, "", "default"):
        return default_model_dir()
    path = Path(model)
    if not (path / "config.json").exists():
        raise QuantkitError(f"{path}: not a model folder (no config.json)")
    check_links(path)
    return path


def check_weights(path: Path) -> None:
    """Refuse, before anything loads, a folder whose weights are not valid safetensors: the
    same check as ``quantkit convert`` (a pickle-only folder is named, never unpickled)."""
    SafetensorsSource(path)


def is_quantized(path: Path) -> bool:
    try:
        return "quantization_config" in json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise QuantkitError(f"{path / 'config.json'}: not JSON ({e.msg})") from None


def load_model(path: Path, device: str = "cpu", backend: str | None = None):
    """A transformers model (a causal LM, or a vision-language model's own class): QuantLinear
    modules for a quantized checkpoint, else fp32."""
    import torch
    from transformers import AutoConfig

    if is_quantized(path) and is_quantized_source(path):   # FP8 blocks, MXFP4: the float model they stand for
        return load_dequantized(path, torch.float32).to(device)
    if is_quantized(path):
        return load(path, backend=backend, device=device).eval()
    # use_safetensors: never fall back to a pickle, even beside safetensors files
    cls = auto_class(AutoConfig.from_pretrained(path))   # a vision-language model's own class
    return cls.from_pretrained(path, dtype=torch.float32, use_safetensors=True).to(device).eval()


def load_tokenizer(*paths: Path):
    from transformers import AutoTokenizer

    for p in paths:
        if (p / "tokenizer.json").exists() or (p / "tokenizer_config.json").exists():
            tok = AutoTokenizer.from_pretrained(p)
            _check_chat_template(tok, p)
            return tok
    raise QuantkitError(f"{paths[0]}: no tokenizer files (tokenizer.json)")


def _check_chat_template(tok, folder: Path) -> None:
    """The model's chat template renders one user turn with the generation prompt (every task
    prompt of the suite takes that form); a template that raises is one line naming the folder."""
    if not getattr(tok, "chat_template", None):
        return
    try:
        tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    except Exception as e:   # the model's own template code: whatever it raises
        raise QuantkitError(f"{folder}: the chat template fails on one user turn "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def module_errors(ckpt: Path) -> dict[str, float] | None:
    """SQNR (dB) per quantized module from the checkpoint's quantization log, if any."""
    log = ckpt / "quantization_log.json"
    if not log.exists():
        return None
    try:
        modules = json.loads(log.read_text()).get("modules") or {}
    except json.JSONDecodeError as e:
        raise QuantkitError(f"{log}: not JSON ({e.msg})") from None
    out = {name: float(s["sqnr_db"]) for name, s in modules.items() if isinstance(s, dict) and "sqnr_db" in s}
    return out or None
