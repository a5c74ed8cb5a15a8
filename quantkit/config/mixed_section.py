"""The recipe's ``mixed:`` section: plan the formats from measured sensitivity under a budget.

    mixed:
      budget_bits: 5.0                     # average bits per planned weight (or budget_bytes)
      candidates: [W4_G64, W8_CHANNEL, KEEP]   # names from CANDIDATES or {name, weights}
      sensitivity: out/m/sensitivity.json  # reuse a search (optional; another budget, same model)
      tokens: 2048                         # calibration tokens the search scores with (DEFAULT_TOKENS)

    mixed:
      smallest_go: {tolerance_bits: 0.25}  # instead of a budget: the smallest plan whose verdict
                                           # is GO (--budget go; smallest_go.py)

The recipe's own groups say which linears are quantized (and, with one group, the observer
and activation order the named candidates take); the plan replaces them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from quantkit.errors import QuantkitError
from quantkit.config.validation import config, invalid
from quantkit.config.candidates import Candidate, check_candidates

#: Calibration tokens the search scores with by default: on SmolLM2 the diag score's ranking
#: agrees with the exact KL at Spearman 0.965 (W4 g64) at 2048 tokens against 0.974 at 8192,
#: and the search costs 0.35x a plain w4a16-g64-gptq conversion's CPU time (4096: 0.54x;
#: benchmarks/RESULTS.md, "Mixed precision").
DEFAULT_TOKENS = 2048

Positive = Annotated[float, Field(gt=0, strict=True)]   # strict: an int is fine, "5" and true are not


@config
class SmallestGo:
    """Bisect the budget between ``low_bits`` (None: the cheapest plan of the candidates) and
    ``high_bits`` (None: uniform W8_CHANNEL where it is a candidate, else the costliest plan),
    converting and evaluating each plan, until the GO and the NO-GO budgets are within
    ``tolerance_bits``."""

    low_bits: Positive | None = None
    high_bits: Positive | None = None
    tolerance_bits: Positive = 0.25

    @model_validator(mode="after")
    def _ordered(self) -> "SmallestGo":
        if self.low_bits is not None and self.high_bits is not None and self.low_bits >= self.high_bits:
            raise invalid(f"must be above low_bits ({self.low_bits})", "high_bits")
        return self


@config
class MixedSettings:
    budget_bits: Positive | None = None
    budget_bytes: Annotated[StrictInt, Field(gt=0)] | None = None
    # None: DEFAULT_CANDIDATES for a search, every candidate of a reused sensitivity file
    candidates: tuple[Candidate, ...] | None = None
    sensitivity: StrictStr | None = None
    # at most 32x the default, whose ranking already sits within 0.01 Spearman of 8192 tokens':
    # more only grows the search's memory and time (a typo's extra digits, not a choice)
    tokens: Annotated[StrictInt, Field(ge=64, le=65536)] = DEFAULT_TOKENS
    labels: Literal["sampled", "data"] = "sampled"
    method: Literal["diag", "token", "sample", "local"] | None = None   # None: the search's default
    smallest_go: SmallestGo | None = None

    @field_validator("candidates", mode="after")
    @classmethod
    def _distinct(cls, value):
        if value is None:
            return value
        try:
            check_candidates(list(value), "candidates")
        except QuantkitError as e:   # its text, without the key the path already names
            raise invalid(str(e).removeprefix("candidates: ")) from None
        return value

    @model_validator(mode="after")
    def _one_budget(self) -> "MixedSettings":
        if self.budget_bits is not None and self.budget_bytes is not None:
            raise invalid("give budget_bits or budget_bytes, not both", "budget_bits")
        if self.smallest_go is not None and (self.budget_bits is not None or self.budget_bytes is not None):
            raise invalid("give a budget or smallest_go, not both", "smallest_go")
        return self

    @property
    def has_budget(self) -> bool:
        return self.budget_bits is not None or self.budget_bytes is not None
