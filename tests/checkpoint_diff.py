"""How far two W4A16 (pack-quantized) checkpoints of one model and recipe are apart.

For runs that merge the same statistics in another summation order (data-parallel
calibration: tests/test_distributed.py, benchmarks/distributed.py). The figures:
``code_share`` (share of int4 codes that differ), ``max_code_step`` (the largest difference
between two codes), ``scale_rtol`` (largest relative difference of two scales), ``other``
(names of the tensors outside the packed targets that are not bit-identical).
"""

from __future__ import annotations

import torch


def int4_codes(packed: torch.Tensor) -> torch.Tensor:
    """The eight unsigned 4-bit codes of each int32 word, element 0 in the lowest nibble."""
    return torch.stack([(packed >> (4 * k)) & 0xF for k in range(8)], dim=-1)


def checkpoint_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    if a.keys() != b.keys():
        raise ValueError(f"different tensors: {sorted(a.keys() ^ b.keys())[:5]}")
    codes = differing = step = 0
    scale_rtol, other = 0.0, []
    for k in sorted(a):
        if k.endswith("weight_packed"):
            ca, cb = int4_codes(a[k]), int4_codes(b[k])
            codes += ca.numel()
            differing += int((ca != cb).sum())
            step = max(step, int((ca - cb).abs().max()))
        elif k.endswith("weight_scale"):
            rel = (a[k].float() - b[k].float()).abs() / a[k].float().abs().clamp(min=1e-12)
            scale_rtol = max(scale_rtol, float(rel.max()))
        elif not torch.equal(a[k], b[k]):
            other.append(k)
    return {"codes": codes, "differing_codes": differing, "code_share": differing / max(codes, 1),
            "max_code_step": step, "scale_rtol": scale_rtol, "other": other}
