"""The package's import graph has no circle, type-checking imports included: a module can be read
and replaced without the modules it reaches reaching back. The check can fail: a planted pair of
imports that close a circle is found."""

from __future__ import annotations

import grimp


def import_graph(package: str = "quantkit") -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of the package it imports (any import statement)."""
    g = grimp.build_graph(package, include_external_packages=False)
    return {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (``[a, b, ..., a]``), or None: a depth-first walk that meets a module
    still on its own path."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path, on_path, stack = [root], {root}, [iter(sorted(graph.get(root, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                finished = path.pop()
                done.add(finished)
                on_path.discard(finished)
                stack.pop()
                continue
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_import_graph_has_no_circle():
    circle = find_circle(import_graph())
    assert circle is None, " -> ".join(circle)


def test_a_planted_circle_is_found():
    graph = import_graph()
    graph["quantkit.errors"] = graph["quantkit.errors"] | {"quantkit.cli"}   # errors would import the CLI
    circle = find_circle(graph)
    assert circle is not None and circle[0] == circle[-1] and "quantkit.errors" in circle
