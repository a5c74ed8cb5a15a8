"""Thin helpers around a transformers causal LM: device, batched forward, greedy generation."""
from __future__ import annotations

import torch
from torch import nn


def model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def pad_id(tokenizer) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


def right_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids, mask


@torch.inference_mode()
def forward_logits(model: nn.Module, seqs: list[list[int]], pad: int) -> torch.Tensor:
    """Logits ``[B, T, V]`` (float32, CPU) for right-padded sequences."""
    ids, mask = right_padded(seqs, pad)
    dev = model_device(model)
    out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False)
    return out.logits.float().cpu()


@torch.inference_mode()
def greedy(model: nn.Module, prompts: list[list[int]], n_tokens: int, pad: int, eos: int | None) -> list[list[int]]:
    """Greedy continuation of each prompt (left-padded batch), cut after EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    dev = model_device(model)
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=n_tokens,
                         do_sample=False, num_beams=1, temperature=None, top_p=None, top_k=None,
                         pad_token_id=pad, eos_token_id=eos)
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos)]
        rows.append(row)
    return rows
