"""Tiny random models saved as real Hugging Face folders, and token ids, for tests."""

from __future__ import annotations

import json
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


def make_streamed_llama_dir(path: Path, num_layers: int, hidden: int, intermediate: int | None = None,
                            vocab: int = 32000, dtype: torch.dtype = torch.float32, shard_bytes: float = 400e6,
                            seed: int = 0) -> Path:
    """Save a random Llama (untied head, head_dim 64) shard by shard: never more than one shard
    in memory, so a model larger than the memory cap it is tested under can be built beside it."""
    from transformers import LlamaConfig

    inter = intermediate or 4 * hidden
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=num_layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, tie_word_embeddings=False, dtype=str(dtype).split(".")[1])
    cfg.architectures = ["LlamaForCausalLM"]
    path.mkdir(parents=True)
    cfg.save_pretrained(path)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (hidden, hidden),
                       p + "self_attn.v_proj.weight": (hidden, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter)})
    save_random_shards(path, {k: (shape, dtype) for k, shape in shapes.items()}, 0.02, shard_bytes, seed)
    return path


def save_random_shards(path: Path, shapes: dict[str, tuple[tuple, torch.dtype]], std: float, shard_bytes: float,
                       seed: int = 0) -> None:
    """Random tensors of ``shapes`` (norms ones, the rest N(0, std)) saved shard by shard, with
    the index: never more than one shard in memory."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    shard, size, index, names = {}, 0, {}, list(shapes)
    for k in names:
        shape, dtype = shapes[k]
        t = torch.ones(shape) if k.endswith("norm.weight") else torch.randn(shape, generator=g) * std
        shard[k] = t.to(dtype)
        size += shard[k].numel() * shard[k].element_size()
        if size > shard_bytes or k == names[-1]:
            fname = f"part-{len(set(index.values())) + 1:03d}.safetensors"
            save_file(shard, str(path / fname), metadata={"format": "pt"})
            index.update({key: fname for key in shard})
            shard, size = {}, 0
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))


def make_outlier_llama_dir(path: Path, outliers: int, factor: float, spread: float = 0.0, seed: int = 0,
                           hidden: int = 128, intermediate: int = 256, weight_seed: int = 0) -> Path:
    """A tiny Llama whose norms make ``outliers`` input channels ``factor`` times larger.

    ``spread``: every norm channel is also scaled by exp(N(0, spread)). The activation outliers
    that AWQ and SmoothQuant exist for, planted where the float model stays well-behaved.
    ``seed`` draws the norms, ``weight_seed`` the rest of the model.
    """
    from transformers import AutoModelForCausalLM

    make_llama_dir(path, num_layers=2, hidden=hidden, intermediate=intermediate, seed=weight_seed)
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
