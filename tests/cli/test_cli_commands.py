"""Every command is registered, and a broken import fails loudly instead of removing commands."""

import importlib
import sys

import pytest
from typer.testing import CliRunner

COMMANDS = ("convert", "inspect", "sensitivity", "calibrate", "eval", "plan")


def test_help_lists_every_command():
    from quantkit.cli import app

    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0, res.output
    for name in COMMANDS:
        assert f" {name} " in res.output, (name, res.output)
    registered = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    assert set(COMMANDS) <= registered


def test_broken_evaluation_import_is_not_a_missing_command(monkeypatch):
    # a module of the evaluation package that cannot be imported (a bug, a missing dependency)
    monkeypatch.setitem(sys.modules, "quantkit.evaluation.verdict", None)
    for name in [m for m in sys.modules if m == "quantkit.cli" or m.startswith("quantkit.cli.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match="quantkit.evaluation.verdict"):
        importlib.import_module("quantkit.cli")
