"""Which MoE experts the calibration reached: tokens per expert per layer, the starved ones flagged.

A router sends each token to its top-k experts, so on a small or narrow calibration set some
experts see few tokens or none: their GPTQ Hessians (and activation statistics) come from a
handful of inputs, or from nothing. ``calibration.moe_experts: all`` (the default) runs every
real token through every expert for statistics, while the layer's output still sums the
top-k experts only (``experts.UnfusedExperts``); ``routed`` gives each expert only its
routed tokens, as it sees them in serving.

``Routing`` is what the runner hands an ``UnfusedExperts`` for a layer's calibration passes;
it records per batch the tokens each expert was routed and the tokens its linears saw (a
later pass over a batch replaces an earlier one's count: the last pass is the one whose
outputs the next layer takes). ``coverage_entry`` turns that into the layer's row of the
coverage table in ``quantization_log.json["moe_coverage"]``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import torch


@dataclass
class Routing:
    num_experts: int
    all_experts: bool
    # the running batch's real-token mask over the block's flattened positions (None: all real)
    real_tokens: Callable[[], torch.Tensor | None]
    batch_index: Callable[[], int | None]
    # inside it, the linears' hooks take their inputs as real tokens (no padding to remove)
    selected: Callable[[], ContextManager]
    # batch -> (tokens routed to each expert, tokens each expert's linears saw)
    counts: dict[int | None, tuple[list[int], list[int]]] = field(default_factory=dict)

    @contextmanager
    def dispatch(self, expert: int, routed: int, seen: int) -> Iterator[None]:
        """Expert ``expert`` runs on ``seen`` real tokens, ``routed`` of them its top-k tokens."""
        routed_n, seen_n = self.counts.setdefault(self.batch_index(), ([0] * self.num_experts,
                                                                        [0] * self.num_experts))
        routed_n[expert], seen_n[expert] = routed, seen
        with self.selected():
            yield

    def totals(self) -> tuple[list[int], list[int]]:
        routed = [sum(c[0][e] for c in self.counts.values()) for e in range(self.num_experts)]
        seen = [sum(c[1][e] for c in self.counts.values()) for e in range(self.num_experts)]
        return routed, seen


def coverage_entry(routing: Routing, min_tokens: int,
                   merge: Callable[[list[int]], list[int]] = lambda counts: counts) -> dict[str, Any]:
    """One layer's row: tokens routed to and calibrated on per expert; those under ``min_tokens``.

    ``merge`` adds the other ranks' counts under data-parallel calibration (each rank routed
    only its own batches; ``distributed.merge_sum``).

    >>> import contextlib
    >>> r = Routing(3, False, lambda: None, lambda: 0, contextlib.nullcontext)
    >>> r.counts[0] = ([5, 0, 40], [5, 0, 40])
    >>> coverage_entry(r, 8)
    {'routed': [5, 0, 40], 'calibrated': [5, 0, 40], 'under_min': [0, 1]}
    """
    routed, seen = (merge(c) for c in routing.totals())
    return {"routed": routed, "calibrated": seen, "under_min": [e for e, n in enumerate(seen) if n < min_tokens]}


def coverage_lines(table: dict[str, dict[str, Any]], mode: str, min_tokens: int) -> list[str]:
    """The coverage table as the conversion prints it: one line per MoE block, then the verdict.

    >>> coverage_lines({"model.layers.0.mlp.experts": {"routed": [3, 0], "calibrated": [3, 0],
    ...                 "under_min": [1]}}, "routed", 1)      # doctest: +NORMALIZE_WHITESPACE
    ['expert coverage (calibration tokens per expert; mode routed, minimum 1):',
     '  model.layers.0.mlp.experts: 3 0  under the minimum: expert 1',
     'warning: 1 of 2 experts got fewer than 1 calibration tokens (calibration.moe_experts: all runs every token through every expert)']
    """
    lines = [f"expert coverage (calibration tokens per expert; mode {mode}, minimum {min_tokens}):"]
    starved = total = 0
    for name, row in table.items():
        under = row["under_min"]
        starved += len(under)
        total += len(row["calibrated"])
        flag = f"  under the minimum: expert {', '.join(map(str, under))}" if under else ""
        # in "all" mode the routed counts say which experts the mode rescued
        routed = f" (routed {' '.join(map(str, row['routed']))})" if row["routed"] != row["calibrated"] else ""
        lines.append(f"  {name}: {' '.join(map(str, row['calibrated']))}{routed}{flag}")
    if starved:
        hint = " (calibration.moe_experts: all runs every token through every expert)" if mode == "routed" else ""
        lines.append(f"warning: {starved} of {total} experts got fewer than {min_tokens} calibration tokens{hint}")
    return lines
