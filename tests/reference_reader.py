"""A checkpoint as transformers + compressed-tensors (the reference reader) computes it."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

import quantkit

from model_factory import random_ids


def relative_logit_error(path, seed: int = 3, length: int = 12) -> float:
    """``|ours - theirs| / |theirs|`` of the logits: quantkit.load against transformers' loader."""
    ids = torch.tensor(random_ids(1, length, seed=seed))
    with torch.no_grad():
        ours = quantkit.load(path)(ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(path)(ids).logits
    return float((ours - theirs).norm() / theirs.norm())
