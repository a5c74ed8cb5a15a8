"""Thin helpers around a transformers causal LM: device, batched forward, greedy generation,
and the forward split in two (the body once, the LM head over a few positions at a time), so a
long window's logits never sit in memory whole: Gemma3's 262144-entry vocabulary makes them
12 GB a model for the 11K tokens of the long slices, in float32.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn
from transformers import StoppingCriteria, StoppingCriteriaList


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
def body_states(model: nn.Module, seqs: list[list[int]], pad: int) -> torch.Tensor:
    """The body's last hidden states ``[B, T, H]`` for right-padded sequences (what the head reads)."""
    ids, mask = right_padded(seqs, pad)
    dev = model_device(model)
    out = getattr(model, model.base_model_prefix)(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False)
    return out.last_hidden_state


class _GivenStates(nn.Module):
    """Stands in for a model's body and returns hidden states computed before."""

    def __init__(self, states: torch.Tensor) -> None:
        super().__init__()
        self.states = states

    def forward(self, *args, **kwargs):
        return _BodyOutput(self.states)


class _BodyOutput:
    """A body's output holding only the hidden states: every other field a head may read (an MoE's
    ``router_logits``, a vision-language model's ``image_outputs`` or ``rope_deltas``) is None,
    as when the body was not asked for it; ``[0]`` is the hidden states, as in transformers'."""

    def __init__(self, states: torch.Tensor) -> None:
        self.last_hidden_state = states

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def __getitem__(self, i: int) -> torch.Tensor:
        if i != 0:
            raise IndexError(i)
        return self.last_hidden_state


@torch.inference_mode()
def head_logits(model: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, t, V]`` (float32, CPU) of hidden states ``[B, t, H]`` from ``body_states``.

    The model's own forward runs with its body swapped for one that returns ``states``, so
    whatever the model does after the body (Gemma's logit soft-capping, a logit scale) is its
    own code, not a copy of it here."""
    prefix = model.base_model_prefix
    body = getattr(model, prefix)
    setattr(model, prefix, _GivenStates(states))
    try:
        dummy = torch.zeros(states.shape[:2], dtype=torch.long, device=states.device)
        return model(input_ids=dummy, use_cache=False).logits.float().cpu()
    finally:
        setattr(model, prefix, body)


def position_chunks(width: int, rows: int, chunk_tokens: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` position ranges whose logits, over ``rows`` sequences, hold at most
    about ``chunk_tokens`` tokens.

    >>> list(position_chunks(10, 2, 8))
    [(0, 4), (4, 8), (8, 10)]
    """
    step = max(1, chunk_tokens // max(rows, 1))
    for s in range(0, width, step):
        yield s, min(s + step, width)


class _StopWhen(StoppingCriteria):
    """A transformers stopping criterion: row ``i`` is done once ``stop(its generated ids)``.

    A row that is done is padded from then on like one that reached EOS, and generation ends
    when every row is done: the tokens before the stop are the ones a full-length run gives."""

    def __init__(self, stop: Callable[[list[int]], bool], width: int) -> None:
        self.stop, self.width = stop, width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = [self.stop(row) for row in input_ids[:, self.width:].tolist()]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


@torch.inference_mode()
def greedy(model: nn.Module, prompts: list[list[int]], n_tokens: int, pad: int, eos: int | None,
           stop: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """Greedy continuation of each prompt (left-padded batch), cut after EOS.

    ``stop(generated ids) -> bool`` ends a row early (its continuation is then cut by the
    caller at the same place it would cut a full-length one)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    dev = model_device(model)
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=n_tokens,
                         do_sample=False, num_beams=1, temperature=None, top_p=None, top_k=None,
                         pad_token_id=pad, eos_token_id=eos,
                         **({"stopping_criteria": StoppingCriteriaList([_StopWhen(stop, width)])} if stop else {}))
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos)]
        rows.append(row)
    return rows
