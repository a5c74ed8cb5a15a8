"""Calibration samples as batches of packed rows: what runs through a layer in one call."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.errors import QuantkitError
from quantkit.pipeline.onload import config_dtype
from quantkit.pipeline.memory import available_memory


@dataclass
class CalibrationChunk:
    """Calibration rows that run through a layer in one call.

    ``valid`` marks the positions holding sample tokens (None: all of them); the rest is
    padding at row ends, excluded from every statistic. ``position_ids`` restart at 0 at
    each sample, so packed samples do not attend to each other.
    """

    input_ids: torch.Tensor                 # [rows, row_len]
    position_ids: torch.Tensor | None
    valid: torch.Tensor | None              # [rows, row_len] bool

    @property
    def num_tokens(self) -> int:
        return int(self.valid.sum()) if self.valid is not None else self.input_ids.numel()


def pack_rows(lengths: list[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: the sample indices of each row, each row's lengths summing to <= row_len."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if n > row_len:
            raise ValueError(f"sample {i} has {n} tokens, more than the row length {row_len}")
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_len - n)
    return rows


def make_chunks(samples: list[list[int]], batch_tokens: int, packed: bool = True) -> list[CalibrationChunk]:
    """Calibration samples as batches of at most ``batch_tokens`` positions (at least one row).

    ``packed``: samples share rows of the longest sample's length, position ids restarting
    at each sample. Otherwise each row holds one sample and a batch holds samples of one
    length (no padding, no packing).
    """
    lengths = [len(s) for s in samples]
    if any(n == 0 for n in lengths):
        raise QuantkitError("calibration: a sample has no tokens")
    chunks: list[CalibrationChunk] = []
    if not packed:
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            by_len.setdefault(n, []).append(i)
        for n, idx in sorted(by_len.items(), reverse=True):
            per = max(1, batch_tokens // n)
            for k in range(0, len(idx), per):
                ids = torch.tensor([samples[i] for i in idx[k:k + per]], dtype=torch.long)
                chunks.append(CalibrationChunk(ids, None, None))
        return chunks
    row_len = max(lengths)
    rows = pack_rows(lengths, row_len)
    per = max(1, batch_tokens // row_len)
    for k in range(0, len(rows), per):
        block = rows[k:k + per]
        ids = torch.zeros(len(block), row_len, dtype=torch.long)
        pos = torch.zeros(len(block), row_len, dtype=torch.long)
        valid = torch.zeros(len(block), row_len, dtype=torch.bool)
        for r, members in enumerate(block):
            at = 0
            for i in members:
                n = lengths[i]
                ids[r, at:at + n] = torch.tensor(samples[i], dtype=torch.long)
                pos[r, at:at + n] = torch.arange(n)
                valid[r, at:at + n] = True
                at += n
            # the tail is its own short "sample" of token 0: it attends only to itself
            pos[r, at:] = torch.arange(row_len - at)
        chunks.append(CalibrationChunk(ids, pos, None if bool(valid.all()) else valid))
    return chunks


#: Positions per calibration batch (at least one row). The whole set still runs as one pass
#: when it fits ``calibration.batch_tokens`` (quantkit.pipeline.interleave); batches of this size keep
#: the layer's element-wise work in the CPU caches (measured in quantkit/pipeline/interleave.py).
MICRO_BATCH_TOKENS = 4096


def auto_batch_tokens(config, device: str, float_inputs: bool = False) -> int:
    """Positions per calibration batch: what fits a quarter of the free memory in one layer call
    (``float_inputs``: with the float model's activations carried beside, for GPTAQ)."""
    d = int(getattr(config, "hidden_size", 4096))
    inter = int(getattr(config, "intermediate_size", 4 * d) or 4 * d)
    elt = torch.empty(0, dtype=config_dtype(config)).element_size()
    # the layer's input and output, norms, q/k/v/attention output, MLP intermediates, and
    # the fp32 copy a Hessian accumulation makes of the widest input
    per_token = elt * (8 * d + 4 * inter) + 4 * max(d, inter)
    if float_inputs:
        # the float model's layer input, and each target linear's float input held while the
        # layer is quantized (attention in and out, MLP in and out), plus the fp32 difference
        # GPTAQ's accumulation makes of the widest
        per_token += elt * (5 * d + inter) + 4 * max(d, inter)
    if str(device).startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device))
    else:

        free = available_memory()   # a container's cap, not the host's free memory
    return max(1, int(free * 0.25) // per_token)


def num_tokens_of(samples: list[list[int]] | None) -> int:
    return sum(len(s) for s in samples) if samples else 0
