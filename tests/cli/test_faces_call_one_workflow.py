"""Each command module is a face: it calls one workflow function, and that function is part of the
Python API (``quantkit.api``), so a Python caller runs what the command runs without copying it."""
from __future__ import annotations

import ast
from pathlib import Path

import quantkit.api

CLI = Path(__file__).resolve().parents[2] / "quantkit" / "cli"
# where the work a command runs lives
WORKFLOW_MODULES = ("quantkit.workflows.", "quantkit.calibration.calibration_set", "quantkit.runtime.checkpoint_info")


def workflow_functions(source: str) -> set[str]:
    """The functions (lower-case names; types are the requests and options) a module imports from
    a workflow module."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(WORKFLOW_MODULES):
            names |= {a.name for a in node.names if a.name[0].islower()}
    return names


def test_every_command_calls_one_workflow_function_the_api_exports():
    faces = sorted(CLI.glob("*_command.py"))
    assert len(faces) == 7
    for face in faces:
        called = workflow_functions(face.read_text(encoding="utf-8"))
        assert len(called) == 1, (face.name, called)
        assert called <= set(quantkit.api.__all__), (face.name, called)


def test_a_face_that_calls_two_workflow_functions_is_seen():
    planted = ("def cmd():\n    from quantkit.workflows.evaluate import evaluate_paths, report_output, PathsOptions\n"
               "    from quantkit.cli.console import fail\n")
    assert workflow_functions(planted) == {"evaluate_paths", "report_output"}
