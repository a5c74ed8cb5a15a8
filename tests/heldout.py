"""Held-out real text for quality checks: the evaluation suite's English slices (Linux kernel
documentation and Lee news corpus, eval/PROVENANCE), never the calibration sample."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

EVAL_SLICES = Path(__file__).resolve().parent.parent / "eval" / "slices"


def heldout_ids(tokenizer, n_tokens: int = 2048) -> list[int]:
    texts = []
    for name in ("long-en", "names-en"):
        for line in (EVAL_SLICES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            text = json.loads(line).get("text")  # plain-text items only (not extraction prompts)
            if text:
                texts.append(text)
    ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    if len(ids) < n_tokens:
        raise ValueError(f"held-out text has {len(ids)} tokens, {n_tokens} asked")
    return ids[:n_tokens]


@torch.no_grad()
def window_perplexity(model, ids: list[int], window: int = 512) -> float:
    """exp(mean NLL) over non-overlapping windows; each window's first token is context only."""
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = torch.tensor([ids[start:start + window]])
        if chunk.shape[1] < 2:
            break
        logits = model(chunk).logits.float()
        logp = torch.log_softmax(logits[0, :-1], dim=-1)
        nll -= logp.gather(1, chunk[0, 1:, None]).sum().item()
        count += chunk.shape[1] - 1
    return math.exp(nll / count)
