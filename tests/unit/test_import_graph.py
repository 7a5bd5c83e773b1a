"""No import circles anywhere in the product or the dev harness.

The layer contracts in ``make lint`` order the packages of kmodkit.core; this
holds every module, inside a package and across packages, to a graph without
cycles, so any module can be read (and imported) on its own.
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in graph.modules:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("kmodkit", "kmodkit_dev")
    assert _cycles(graph) == []
