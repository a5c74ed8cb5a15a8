"""Imports sit at the top of a module. An import inside a function is allowed only for a
dependency whose import cost was measured and is written here with it (docs/DESIGN.md,
"Deferred imports"), or in a command module, whose commands import their work when they run so
that ``quantkit --help`` and a refused flag answer without loading torch."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "quantkit"

# Measured with ``python -X importtime`` on the 2-core development machine (cumulative seconds).
DEFERRED = {
    "torch": "3.1 s: kept out of what every command reads first (model folders, recipes, outputs)",
    "safetensors": "its torch half imports torch (3.1 s)",
    "transformers": "2.0 s over torch: only loading and running a model needs it",
    "datasets": "2.2 s: only a Hugging Face dataset as calibration input",
    "matplotlib": "1.4 s: only the plots of the reports",
    "triton": "0.5 s, and it may fail to load: the kernel registry falls back to torch, saying so",
    "gguf": "0.4 s: only the embedded default's first dequantization",
    "accelerate": "0.3 s: only the big-model loader",
    "lm_eval": "0.2 s over transformers: only the lm-eval tasks",
    "pyarrow": "only a Parquet log",
}
COMMAND_FOLDER = "cli"   # quantkit/cli/: one module per command
# Modules that load what they compute with on first use, and why:
LOADED_ON_FIRST_USE = {
    # the kernel registry's backends: the Triton ones import triton (above)
    "kernels/__init__.py",
    # the measure registry is read by the verdict, which `quantkit eval`'s module reads at
    # `quantkit --help` (0.3 s then, against 2.3 s with torch); computing a measure needs
    # torch (divergence.py) or the models' code (tasks.py)
    "evaluation/measures/teacher_forced.py",
    "evaluation/measures/tasks.py",
    # business.py reads the label rule while a log is read (no torch then); encoding a reply for
    # the label measures needs forced.py, which imports torch
    "evaluation/label_tasks.py",
    # convert's workflow checks the request and the recipe before the evaluation's modules load
    # transformers (2.0 s), so a refused conversion answers in the time torch takes to import
    "workflows/convert_checkpoint.py",
}


def function_imports(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, top-level module) of every import inside a function that is not allowed."""
    bad = []
    for fn in ast.walk(ast.parse(source, filename)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "."]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in DEFERRED:
                    bad.append((node.lineno, name))
    return sorted(set(bad))


def test_imports_sit_at_module_top():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == COMMAND_FOLDER or rel.as_posix() in LOADED_ON_FIRST_USE:
            continue
        for line, name in function_imports(path.read_text(encoding="utf-8"), str(path)):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} inside a function")
    assert not offenders, "\n".join(offenders)


def test_a_planted_function_import_is_found():
    src = "import os\n\ndef f():\n    import json\n    from quantkit.errors import QuantkitError\n    import torch\n    return json\n"
    assert function_imports(src, "planted.py") == [(4, "json"), (5, "quantkit.errors")]
