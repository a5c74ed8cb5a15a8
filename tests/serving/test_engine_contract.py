"""One engine contract: only serving/vllm.py (and the CLI's list of choices) names vLLM, the
evaluation and the load test reach an engine only through serving/'s contract, and every
registered engine implements it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from quantkit.serving import contract
from quantkit.serving.engines import ENGINES, engine_kind

PACKAGE = Path(__file__).resolve().parents[2] / "quantkit"
LITERAL = re.compile(r"""["']vllm["']""")


def test_only_the_vllm_module_names_the_engine():
    found = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if LITERAL.search(p.read_text()))
    assert found == ["serving/vllm.py"], found


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_engine_implementation_is_imported_outside_serving():
    """The evaluation and the load test hold no server code: they import the contract and the
    registry, never an engine's module, nor start processes for a server themselves."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "serving":
            continue
        imported = _imports(path)
        if "quantkit.serving.vllm" in imported or "quantkit.serving.watchdog" in imported:
            offenders.append(f"{rel}: imports an engine implementation")
        if rel.parts[0] == "evaluation" and "subprocess" in imported and rel.name != "sandbox.py" \
                and "code_exec" not in rel.name and "lm_eval" not in rel.name:
            offenders.append(f"{rel}: starts processes")
    assert not offenders, offenders


def test_every_registered_engine_implements_the_contract():
    members = [m for m in dir(contract.EngineKind) if not m.startswith("_")]
    assert set(members) >= {"find", "dtype", "start", "launch_config", "command_line"}
    for name, kind in ENGINES.items():
        assert kind.name == name and engine_kind(name) is kind
        for m in members:
            assert callable(getattr(kind, m)), (name, m)
