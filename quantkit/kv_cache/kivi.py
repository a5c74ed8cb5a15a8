"""INT8 KV in the KIVI layout (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit
Quantization for KV Cache"): keys per channel, values per token. No serving engine loads it from
a checkpoint; quantkit evaluates it so its error can be set beside the formats engines offer.

The cache quantkit simulates (``int8-kivi``), with KIVI's asymmetric min-max quantizer at 8 bits:
- **K**: per KV head and channel, over groups of ``GROUP`` (32) consecutive token positions.
  Keys are quantized ``RESIDUAL`` (128) at a time, as in KIVI's decoding loop: the newest keys,
  those since the last multiple of 128 positions, stay in full precision (KIVI's residual) until
  128 have gathered. So the query at position ``t`` reads the keys at positions below
  ``128 * floor((t + 1) / 128)`` quantized and the later ones as they are; a group's range only
  ever covers tokens already written (nothing from the future leaks into a scale).
- **V**: per token, over groups of 32 channels of each head, quantized as written (KIVI also
  keeps its newest 128 values in full precision; here none are: V's error is, if anything,
  overstated).
Positions are each sequence's own, from the ``position_ids`` transformers passes to attention
(left padding in generation: padded keys get negative positions and are never quantized nor
counted in a group); without them, the key's index in the cache. Two limits, both outside what
the evaluation runs: rows packing several samples (positions restarting inside a row) are not
told apart, and a sliding-window layer's cache that has dropped the start of a group
(decoding past the window) computes that group's range over the keys it still holds.

Attention runs in query blocks that share one cutoff (at most ``T / 128 + 1`` blocks per call,
each over the keys it can see): every block calls the base attention (sdpa or eager) with keys
quantized below its cutoff, so nothing larger than the base attention's own ``[block, T]``
scores is ever built.
"""

from __future__ import annotations

from typing import Callable

import torch

from quantkit.kv_cache.numerics import channel_groups, group_minmax

GROUP = 32       # tokens per K scale (per channel), channels per V scale (per token): KIVI's G
RESIDUAL = 128   # keys kept in full precision until this many have gathered: KIVI's R
BITS = 8


def quantize_values(v: torch.Tensor) -> torch.Tensor:
    return channel_groups(v, GROUP, BITS)


def quantize_keys(k: torch.Tensor, pos: torch.Tensor, below: torch.Tensor) -> torch.Tensor:
    """``k`` ``[B, H, T, D]`` with the keys at positions ``0 <= pos < below`` (``pos`` ``[B, T]``,
    ``below`` ``[B]``) quantized per channel over groups of ``GROUP`` positions; the others (the
    residual, padding) as they are."""
    valid = (pos >= 0) & (pos < below[:, None])
    gid = torch.where(valid, torch.div(pos, GROUP, rounding_mode="floor"), -1)
    dummy = int(gid.max()) + 1   # the keys left as they are share one group nobody reads
    gid = torch.where(valid, gid, dummy)
    b, h, _, d = k.shape
    idx = gid[:, None, :, None].expand(b, h, -1, d)
    kf = k.float()
    lo = torch.full((b, h, dummy + 1, d), float("inf"), device=k.device).scatter_reduce(2, idx, kf, "amin")
    hi = torch.full((b, h, dummy + 1, d), float("-inf"), device=k.device).scatter_reduce(2, idx, kf, "amax")
    q = group_minmax(kf, lo.gather(2, idx), hi.gather(2, idx), BITS).to(k.dtype)
    return torch.where(valid[:, None, :, None], q, k)


def cutoffs(q_pos: torch.Tensor) -> torch.Tensor:
    """Per query position, the positions below which its keys are quantized."""
    return (RESIDUAL * torch.div(q_pos + 1, RESIDUAL, rounding_mode="floor")).clamp_min(0)


def last_positions(position_ids: torch.Tensor | None, batch: int, keys: int, device) -> torch.Tensor:
    """Each row's position of its last query (which is its last key: the cache was just updated)."""
    if position_ids is None:
        return torch.full((batch,), keys - 1, dtype=torch.long, device=device)
    return position_ids[..., -1].to(device=device, dtype=torch.long).expand(batch)


def attend(fn: Callable, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask,
           kwargs: dict, bool_mask: bool):
    """``fn`` (the base attention) over keys as a KIVI cache holds them for each query."""
    b, _, nq, _ = query.shape
    t = key.shape[2]
    last = last_positions(kwargs.get("position_ids"), b, t, key.device)
    k_pos = last[:, None] - (t - 1) + torch.arange(t, device=key.device)
    cut = cutoffs(last[:, None] - (nq - 1) + torch.arange(nq, device=key.device))
    kq = quantize_keys(key, k_pos, cut[:, -1])
    change = (cut[:, 1:] != cut[:, :-1]).any(dim=0).nonzero().flatten().add(1).tolist()
    bounds = [0, *change, nq]
    if len(bounds) == 2:
        return fn(module, query, _keys_below(kq, key, k_pos, cut[:, 0], t), value, mask, **kwargs)
    outs = []
    for i0, i1 in zip(bounds[:-1], bounds[1:]):
        end = t - nq + i1   # the last query of the block sees the keys before this index
        keys = _keys_below(kq[:, :, :end], key[:, :, :end], k_pos[:, :end], cut[:, i0], end)
        m = mask[:, :, i0:i1, :end] if mask is not None else \
            _causal(i0, i1, t - nq, end, bool_mask, query.dtype, query.device)
        out, _ = fn(module, query[:, :, i0:i1], keys, value[:, :, :end], m, **kwargs)
        outs.append(out)
    return torch.cat(outs, dim=1), None


def _keys_below(kq, key, k_pos, cut, t):
    return torch.where((k_pos[:, :t] < cut[:, None])[:, None, :, None], kq, key)


def _causal(i0: int, i1: int, offset: int, end: int, as_bool: bool, dtype, device) -> torch.Tensor:
    """The plain causal mask of queries ``i0..i1`` (cache indices ``offset + i``) over ``end`` keys:
    transformers hands attention no mask exactly when it is plain causal (no padding, no window
    reached), and a block's queries do not start at key 0, so sdpa's ``is_causal`` would misalign."""
    allowed = torch.arange(end, device=device)[None, :] <= (offset + torch.arange(i0, i1, device=device))[:, None]
    if as_bool:
        return allowed[None, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
