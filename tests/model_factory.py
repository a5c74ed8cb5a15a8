"""Tiny random models saved as real Hugging Face folders, and token ids, for tests."""

from __future__ import annotations

from pathlib import Path

import torch


def make_llama_dir(path: Path, num_layers: int = 2, hidden: int = 64, intermediate: int = 128,
                   heads: int = 4, kv_heads: int = 2, vocab: int = 256, tie: bool = True,
                   seed: int = 0, arch: str = "llama") -> Path:
    """Save a random-initialised causal LM (with a tokenizer-free config) to ``path``."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    cfg = cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
              num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
              max_position_embeddings=4096, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # larger-than-init weights so quantization error is visible
        for n, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_outlier_llama_dir(path: Path, outliers: int, factor: float, spread: float = 0.0, seed: int = 0) -> Path:
    """A tiny Llama whose norms make ``outliers`` input channels ``factor`` times larger.

    ``spread``: every norm channel is also scaled by exp(N(0, spread)). The activation outliers
    that AWQ and SmoothQuant exist for, planted where the float model stays well-behaved.
    """
    from transformers import AutoModelForCausalLM

    make_llama_dir(path, num_layers=2, hidden=128, intermediate=256)
    model = AutoModelForCausalLM.from_pretrained(path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                if spread:
                    norm.weight.mul_(torch.exp(spread * torch.randn(norm.weight.shape[0], generator=g)))
                norm.weight[torch.randperm(norm.weight.shape[0], generator=g)[:outliers]] *= factor
    model.save_pretrained(path)
    return path


def random_ids(n: int = 2, length: int = 24, vocab: int = 256, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def save_byte_tokenizer(path: Path) -> Path:
    """A byte-level tokenizer with no merges (ids 0-255, ``<eos>`` = 256) saved into ``path``,
    so a tiny model folder takes text calibration through the CLI; its vocab fits 260."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>").save_pretrained(path)
    return path
