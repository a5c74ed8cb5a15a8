"""No script or test helper may share its name with an installed module.

A script run as ``python benchmarks/X.py`` puts ``benchmarks/`` first on ``sys.path``, and
pytest puts each test folder there too; a file there named like a package shadows it for
everything imported afterwards. transformers 5.25 imports the ``kernels`` package at import
time, so ``benchmarks/kernels.py`` broke every benchmark that imports transformers.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = [ROOT / "benchmarks", ROOT / "scripts", *sorted(
    p for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__")] + [ROOT / "tests"]


def _module_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "conftest")


def _installed_origin(name: str) -> str | None:
    """Where ``import name`` resolves with none of the project's script folders on the path."""
    if name in sys.stdlib_module_names:
        return "the standard library"
    ours = {str(d) for d in SCRIPT_DIRS} | {"", "."}
    saved = sys.path[:]
    cached = sys.modules.get(name)
    try:
        sys.path[:] = [p for p in saved if p not in ours and Path(p or ".").resolve() not in SCRIPT_DIRS]
        sys.modules.pop(name, None)
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
        if cached is not None:
            sys.modules[name] = cached
    if spec is None:
        return None
    origin = spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]
    return None if Path(origin).resolve().is_relative_to(ROOT) and ".venv" not in Path(origin).parts else origin


def test_the_check_sees_a_real_clash():
    assert _installed_origin("transformers") is not None
    assert _installed_origin("json") == "the standard library"
    assert _installed_origin("quantkit_no_such_module_x") is None


def test_no_script_or_helper_shadows_an_installed_module():
    clashes = [f"{d.relative_to(ROOT)}/{n}.py shadows {origin}"
               for d in SCRIPT_DIRS for n in _module_names(d)
               if (origin := _installed_origin(n)) is not None]
    assert not clashes, "; ".join(clashes)
