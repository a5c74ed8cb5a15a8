"""Every function in quantkit/ is short and takes few parameters.

- Length: at most ``MAX_LINES`` lines from the ``def`` line to the last line inclusive
  (decorators not counted), outside ``quantkit/kernels/`` (a ``@triton.jit`` body is one GPU
  program, kept whole as in Triton's tutorials).
- Parameters: at most ``MAX_PARAMS``, ``self``/``cls`` not counted, ``*args`` and ``**kwargs``
  one each, except a typer command's (every parameter's default a ``typer.Option`` or ``typer.Argument``):
  its parameters are the command-line options, one each.
  ``@triton.jit`` kernels are exempt: their signature is the launch ABI (pointers, sizes,
  strides, constexpr tile sizes), which a record cannot pass through.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "quantkit"
MAX_LINES = 80
MAX_PARAMS = 8
LENGTH_EXEMPT = ("kernels/",)


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("triton.jit", "jit")


def _is_typer_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    defaults = [*a.defaults, *(d for d in a.kw_defaults if d is not None)]
    every = len(defaults) == len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return bool(defaults) and every and all(isinstance(d, ast.Call) and ast.unparse(d.func) in ("typer.Option", "typer.Argument")
                                  for d in defaults)


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def offenders(source: str, rel: str) -> list[str]:
    """``path:line name: measure`` for each function of ``source`` (at ``rel``, relative to the
    package) over a limit."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        where = f"quantkit/{rel}:{fn.lineno} {fn.name}"
        lines = fn.end_lineno - fn.lineno + 1
        if lines > MAX_LINES and not rel.startswith(LENGTH_EXEMPT):
            out.append(f"{where}: {lines} lines (at most {MAX_LINES})")
        params = _param_count(fn)
        jit = any(_is_triton_jit(d) for d in fn.decorator_list)
        if params > MAX_PARAMS and not jit and not _is_typer_command(fn):
            out.append(f"{where}: {params} parameters (at most {MAX_PARAMS})")
    return out


def test_every_function_is_short_and_takes_few_parameters():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += offenders(path.read_text(), path.relative_to(PACKAGE).as_posix())
    assert not found, f"{len(found)} functions over the limits:\n" + "\n".join(found)


def test_the_checker_flags_long_functions_and_long_signatures():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))   # the def line makes it MAX_LINES + 1
    source = (f"def long_one():\n{body}"
              "def wide(a, b, c, d, e, f, g, *rest, **options):\n    return a\n"
              "class C:\n    def method(self, a, b, c, d, e, f, g, h):\n        return a\n"
              "@triton.jit\ndef kernel(a, b, c, d, e, f, g, h, i, j):\n    pass\n")
    assert offenders(source, "evaluation/example.py") == [
        f"quantkit/evaluation/example.py:1 long_one: {MAX_LINES + 1} lines (at most {MAX_LINES})",
        f"quantkit/evaluation/example.py:{MAX_LINES + 2} wide: 9 parameters (at most {MAX_PARAMS})",
    ]
    # the exemptions: length inside kernels/, parameters of a typer command (its options)
    assert offenders(source, "kernels/example.py") == [
        f"quantkit/kernels/example.py:{MAX_LINES + 2} wide: 9 parameters (at most {MAX_PARAMS})"]
    options = ", ".join(f"o{i}: int = typer.Option({i})" for i in range(MAX_PARAMS + 1))
    command = f"def command(model: str = typer.Argument(None), {options}):\n    return model\n"
    assert offenders(command, "cli.py") == []
    helper = f"def helper(model: str, {options}):\n    return model\n"   # one plain parameter: not a command
    assert offenders(helper, "cli.py") == [f"quantkit/cli.py:1 helper: {MAX_PARAMS + 2} parameters (at most {MAX_PARAMS})"]
    # a decorator does not count towards the length, and a function at the limit passes
    at_limit = "@staticmethod\ndef f():\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    assert offenders(at_limit, "x.py") == []
