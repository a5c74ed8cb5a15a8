"""A tiny Llama and a byte-level BPE tokenizer trained on the shipped slices, built in
seconds, plus the planted faults the verdict must catch."""
from __future__ import annotations

import copy
import json

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from quantkit.evaluation.slices import Slice, SuiteOptions, eval_dir


def tiny_tokenizer(vocab: int = 384) -> PreTrainedTokenizerFast:
    texts = []
    for p in sorted((eval_dir() / "slices").glob("*.jsonl")):
        for line in open(p, encoding="utf-8"):
            it = json.loads(line)
            texts.append(it.get("text") or it.get("prompt") or it.get("question") or "")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def tiny_model(vocab: int, seed: int = 0, max_pos: int = 4096) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
                      initializer_range=0.2, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def fake_quant_linears(model, bits: int, only: str = "", group: int | None = None) -> LlamaForCausalLM:
    """A copy whose decoder Linear weights are symmetric RTN fake-quantized (per channel or group)."""
    m = copy.deepcopy(model)
    qmax = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for name, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear) and ".layers." in name and only in name:
                w = mod.weight
                g = w.reshape(w.shape[0], -1, group) if group else w.reshape(w.shape[0], 1, -1)
                scale = g.abs().amax(-1, keepdim=True).clamp_min(1e-8) / qmax
                q = (g / scale).round().clamp(-qmax - 1, qmax) * scale
                w.copy_(q.reshape_as(w))
    return m


# --- planted faults -------------------------------------------------------------------

def scaled_layer(model, layer: int = 1, factor: float = 4.0) -> LlamaForCausalLM:
    """One decoder layer's Linear weights scaled (as if its scales were written 4x too big)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for mod in m.model.layers[layer].modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.mul_(factor)
    return m


def mlp_at_2_bits(model, layer: int = 0) -> LlamaForCausalLM:
    return fake_quant_linears(model, 2, only=f"layers.{layer}.mlp")


def broken_past(model, position: int = 2048, noise: float = 1.0, seed: int = 0) -> LlamaForCausalLM:
    """A copy whose first decoder layer adds noise to its output only at positions >= ``position``
    (what a KV-cache or RoPE fault looks like: fine on short prompts, wrong deep in a document)."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(m.config.hidden_size, generator=g) * noise

    def hook(mod, args, kwargs, out):
        pos = kwargs.get("position_ids")
        hidden = out[0] if isinstance(out, tuple) else out
        if pos is None:
            return out
        late = (pos >= position).unsqueeze(-1).to(hidden.dtype)
        hidden = hidden + late * direction
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    m.model.layers[0].register_forward_hook(hook, with_kwargs=True)
    return m


def tokens_scrambled(model, tokenizer, pick, noise: float = 3.0, seed: int = 0) -> LlamaForCausalLM:
    """Embedding rows of every token whose text ``pick(text)`` accepts, perturbed."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    vocab = tokenizer.get_vocab()
    ids = [i for t, i in vocab.items() if pick(tokenizer.convert_tokens_to_string([t]))]
    with torch.no_grad():
        emb = m.model.embed_tokens.weight
        emb[ids] += torch.randn(len(ids), emb.shape[1], generator=g) * noise * emb.std()
    return m


def digits_scrambled(model, tokenizer, noise: float = 3.0, seed: int = 0) -> LlamaForCausalLM:
    """Every token containing a digit perturbed: numbers come out wrong."""
    return tokens_scrambled(model, tokenizer, lambda s: any(c.isdigit() for c in s), noise, seed)


def non_ascii_scrambled(model, tokenizer, noise: float = 3.0, seed: int = 0) -> LlamaForCausalLM:
    """Every token with a non-ASCII byte perturbed: Chinese text breaks, the English slices
    (ASCII but for a handful of characters) do not."""
    return tokens_scrambled(model, tokenizer, lambda s: any(ord(c) > 127 for c in s), noise, seed)


def _take(sl: Slice, per_kind: int) -> Slice:
    seen: dict[str, int] = {}
    items = []
    for it in sl.items:
        if seen.get(it["kind"], 0) < per_kind:
            seen[it["kind"]] = seen.get(it["kind"], 0) + 1
            items.append(it)
    return Slice(sl.name, items, sl.public, sl.long_context, sl.source)


# A random tiny model predicts near-uniformly, so its argmax flips on ties that a trained
# model does not have: top-1 and generation agreement get looser limits here; the KL
# limits stay the defaults.
TINY_THRESHOLDS = {"top1_agreement": {"review": 0.85, "nogo": 0.6},
                   "focus_top1_agreement": {"review": 0.85, "nogo": 0.6},
                   "gen_agreement": {"review": 0.2, "nogo": None}}

FAST = SuiteOptions(item_tokens=128, gen_prompts=2, gen_tokens=8, extract_tokens=8, code_tokens=16,
                    code_timeout_s=3.0, batch_tokens=1024)


def massive_key_model(vocab: int, value: float = 8.0, seed: int = 0) -> LlamaForCausalLM:
    """A tiny Llama whose keys carry a massive value in their lowest-frequency rotary pair (a
    k_proj bias of ``value`` on both channels of the pair, ``j`` and ``j + head_dim / 2``), as
    large language models' keys do (Jin et al., 2025, "Massive values in self-attention modules
    are the key to contextual knowledge understanding": concentrated in low-frequency RoPE
    dimensions). Rotary embedding turns that pair by ``position * theta``: at 45 degrees one
    channel holds ``sqrt(2) * value``, where a short prompt (its small angle) shows about
    ``value``; so a static KV scale calibrated on short rows clips the keys deep in a long
    context, and only there.

    Weights are drawn smaller than ``tiny_model``'s (std 0.1, not 0.2) and the head is 5x
    sharper: a random model's argmax sits on near-ties, and with the usual weights the rounding
    of FP8 K alone flips a fifth of them; here it flips about a tenth while KL still shows it."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      initializer_range=0.1, tie_word_embeddings=False, attention_bias=True)
    m = LlamaForCausalLM(cfg).eval()
    d = cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        m.lm_head.weight.mul_(5.0)
        for layer in m.model.layers:
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                if proj.bias is not None:
                    proj.bias.zero_()
            k = attn.k_proj.bias.view(cfg.num_key_value_heads, d)
            k[:, d // 2 - 1] = value   # inv_freq falls with the channel: d/2 - 1 turns slowest
            k[:, d - 1] = value
    return m
