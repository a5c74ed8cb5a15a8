"""``quantkit eval --kv``: the candidate evaluated with a quantized KV cache on top of its weights.

The first option is the deployment's: every measure of every slice runs with the candidate
under it. Each option, and the candidate's weights alone (its own ``kv_cache_scheme``, if any,
set aside), is also a variant the long-context slices score side by side (``evaluate(...,
variants=)``). Static options (``fp8-tensor``, ``fp8-head``) take the checkpoint's scales when
it has them in that layout, else the absmax over calibration rows: the ``--calib`` log's, else
quantkit's default calibration log, ``CALIBRATION_ROWS`` rows of up to the deployment length
(capped at ``CALIBRATION_LEN``), drawn by the sampler across its length buckets so the longest
rows are among them. The report's meta says, per option, where its scales came from.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from quantkit.kv_cache import KVOption, PreparedKV, apply_kv_option, prepare_kv, weights_only
from quantkit.calibration import load_calibration

CALIBRATION_ROWS = 16
CALIBRATION_LEN = 4096
WEIGHTS_ONLY = "weights only"


@dataclass
class CandidateKV:
    prepared: list[PreparedKV] = field(default_factory=list)
    _applied: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)

    def deploy(self, model) -> None:
        """Apply the first option to ``model`` for good (a candidate loaded for one evaluation)."""
        if self.prepared:
            self._applied.enter_context(apply_kv_option(model, self.prepared[0]))

    def variants(self) -> dict[str, Callable]:
        """name -> ``with view(model) as m:`` for the long slices: each option and the weights alone."""
        if not self.prepared:
            return {}
        out: dict[str, Callable] = {WEIGHTS_ONLY: weights_only}
        for p in self.prepared:
            out[f"kv {p.option.name}"] = lambda m, p=p: apply_kv_option(m, p)
        return out

    def meta(self) -> list[dict]:
        return [p.describe() for p in self.prepared]

    def footprint(self, fp: dict) -> dict:
        """Bytes per token of each option (and KIVI's fixed full-precision keys), beside ``plan()``'s."""
        shape = (fp["layers"], fp["kv_heads"], fp["head_dim"])
        return {p.option.name: {"bytes_per_token": p.option.bytes_per_token(*shape),
                                "residual_bytes_per_request": p.option.residual_bytes(*shape)}
                for p in self.prepared}


def candidate_kv(candidate, options: list[KVOption], tokenizer, calibration_log: str | Path | None,
                 max_len: int | None) -> CandidateKV:
    """Prepare ``options`` on the loaded candidate (static scales: once, here)."""
    drawn: list[list[list[int]]] = []

    def rows() -> list[list[int]]:   # drawn once, for the first static option that needs them

        if drawn:
            return drawn[0]
        limit = getattr(candidate.config, "max_position_embeddings", None) or CALIBRATION_LEN
        length = min(max_len or limit, limit, CALIBRATION_LEN)
        drawn.append(load_calibration(calibration_log, tokenizer, CALIBRATION_ROWS, length))
        return drawn[0]

    return CandidateKV([prepare_kv(candidate, o, calibration=rows) for o in options])
