"""What an OpenAI-compatible server may answer, as pydantic models: every answer quantkit reads is
validated here before a figure is computed from it, so a server that returns NaN, nulls, strings
for numbers or lists of the wrong length gives one line naming the server, never a figure and
never a traceback (vLLM's extensions included: ``token_ids``, token ids as ``token_id:N`` keys).

A log-probability is a finite number no greater than 0 (``LOGPROB_SLACK`` for rounding); a token
id an integer in [0, 2^31)."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

LOGPROB_SLACK = 1e-3
MIN_MODEL_LEN = 32   # a served context shorter than this holds no prompt of the suite, nor the probe

Logprob = Annotated[float, Strict(), Field(allow_inf_nan=False, le=LOGPROB_SLACK)]
TokenId = Annotated[int, Strict(), Field(ge=0, lt=2**31)]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Logprobs(_Answer):
    """``choices[i].logprobs`` of a completion (``echo`` with ``logprobs``: one entry a token)."""
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Logprob | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, Logprob] | None] | None = None


class Choice(_Answer):
    text: str | None = None
    logprobs: Logprobs | None = None
    token_ids: list[TokenId] | None = None


class Completion(_Answer):
    choices: list[Choice] = Field(min_length=1)


class ServedModelCard(_Answer):
    id: Annotated[str, Strict(), Field(min_length=1)]
    max_model_len: Annotated[int, Strict(), Field(ge=MIN_MODEL_LEN)] | None = None


class ModelList(_Answer):
    data: list[ServedModelCard] = Field(min_length=1)


def first_problem(e: ValidationError) -> str:
    """One readable line for the first thing wrong in an answer: where, and what.

    >>> try:
    ...     Completion.model_validate({"choices": [{"logprobs": {"token_logprobs": [None, float("nan")]}}]})
    ... except ValidationError as e:
    ...     print(first_problem(e))
    choices.0.logprobs.token_logprobs.1: Input should be a finite number (got nan)
    """
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "the answer"
    got = repr(err.get("input"))
    return f"{where}: {err['msg']} (got {got[:60] + '...' if len(got) > 60 else got})"
