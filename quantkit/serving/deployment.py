"""The context length a model is served at: asked for, else the baseline's own, and never past
what either model's config allows (an engine would refuse it or cut every prompt there)."""
from __future__ import annotations

import json
from pathlib import Path

from quantkit.config.validation import json_object
from quantkit.errors import QuantkitError


def context_limit(folder: Path) -> int | None:
    """``max_position_embeddings`` of a model folder (a vision-language model's text config's);
    a missing or broken config.json is one line naming it."""
    path = folder / "config.json"
    try:
        cfg = json_object(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise QuantkitError(f"{path}: not found (is this a Hugging Face model folder?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise QuantkitError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    limit = (cfg.get("text_config") or cfg).get("max_position_embeddings")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise QuantkitError(f"{path}: max_position_embeddings: expected a positive integer, got {limit!r}")
    return limit


def deployment_length(base_dir: Path, cand_dir: Path, max_len: int | None, source: str | None) -> tuple[int, str]:
    """The length the engine serves: ``max_len``, else the baseline's ``max_position_embeddings``;
    refused in one line when either model's config caps the context below it."""
    base_limit = context_limit(base_dir)
    length = max_len if max_len is not None else base_limit
    if length is None:
        raise QuantkitError(f"--max-len: needed: {base_dir / 'config.json'} gives no max_position_embeddings")
    for who, folder in (("baseline", base_dir), ("candidate", cand_dir)):
        limit = context_limit(folder)
        if limit is not None and length > limit:
            raise QuantkitError(f"{source or '--max-len'}: {length} exceeds the {who}'s max_position_embeddings "
                                f"({limit}, {folder / 'config.json'}): the engine cannot serve the deployment length")
    return length, source or "the baseline's max_position_embeddings"


def _config_or_empty(model_dir: Path) -> dict:
    """``config.json`` as a dict, {} when unreadable (what reads it here has a default; the engine
    or the evaluation names a broken config itself)."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def quantization_config(model_dir: Path) -> dict:
    """``config.json``'s ``quantization_config`` ({} when unreadable or absent: the engine says why)."""
    return _config_or_empty(model_dir).get("quantization_config") or {}


def checkpoint_format(model_dir: Path) -> str | None:
    """The compressed-tensors format of ``model_dir`` (None: not quantized)."""
    return quantization_config(model_dir).get("format")


def vocab_size(model_dir: Path) -> int | None:
    """``vocab_size`` of a model folder (a vision-language model's text config's), None if absent."""
    cfg = _config_or_empty(model_dir)
    size = (cfg.get("text_config") or cfg).get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
