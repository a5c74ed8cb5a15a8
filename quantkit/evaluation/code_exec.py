"""Build HumanEval programs (prompt + completion + tests) and run them behind the sandbox.

The boundary itself (bubblewrap, limits, the unsafe path) is ``sandbox.py``; this module
only turns a problem and a completion into a program and the program's end into a status.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

from quantkit.evaluation.sandbox import Limits, Runner, SandboxUnavailable, code_runner

# lm-eval calls a task's process_results(doc, results) with nothing else: the evaluation
# hands it the runner it opened (sandbox or explicit unsafe) through this variable.
_CURRENT: ContextVar[Runner | None] = ContextVar("quantkit_code_runner", default=None)


@contextlib.contextmanager
def using_runner(runner: Runner | None) -> Iterator[None]:
    """Make ``runner`` the one ``run_program`` uses when it is given none."""
    token = _CURRENT.set(runner)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@dataclass(frozen=True)
class ExecResult:
    passed: bool
    status: str       # "passed", "failed", "timeout", or "error: signal N"
    stderr_tail: str = ""


def run_program(source: str, runner: Runner | None = None, timeout_s: float = 5.0,
                mem_bytes: int = 1 << 30) -> ExecResult:
    """Run ``source`` (program + tests); passed means exit status 0 within the limits.

    Without a ``runner``: the one set by ``using_runner``, else the sandbox, probed now
    (``SandboxUnavailable`` when there is none).

    >>> run_program("assert 1 + 1 == 2").passed
    True
    """
    runner = runner or _CURRENT.get()
    if runner is None:
        try:
            runner = code_runner()
        except SandboxUnavailable as e:
            raise SandboxUnavailable(f"code cannot run: {e}; --unsafe-code-exec runs it without a sandbox") from None
    out = runner.run(source, Limits(wall_s=timeout_s, mem_bytes=mem_bytes))
    if out.returncode is None:
        return ExecResult(False, "timeout", out.stderr_tail)
    if out.returncode == 0:
        return ExecResult(True, "passed", out.stderr_tail)
    if out.signal is not None:
        return ExecResult(False, f"error: signal {out.signal}", out.stderr_tail)
    return ExecResult(False, "failed", out.stderr_tail)


STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```", "\nassert ")


def stops_body(text: str) -> bool:
    """Whether a generated function body has ended (``truncate_completion`` cuts it): what
    follows changes nothing, so generation may stop there."""
    return any(s in text for s in STOP)


def truncate_completion(text: str) -> str:
    """Cut a generated function body where the model starts something else."""
    cut = min((i for i in (text.find(s) for s in STOP) if i >= 0), default=len(text))
    return text[:cut]


def humaneval_program(item: dict, completion: str) -> str:
    return (item["prompt"] + truncate_completion(completion) + "\n\n" + item["test"]
            + f"\n\ncheck({item['entry_point']})\n")
