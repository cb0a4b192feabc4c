"""The product's modules import one another without a circle: the graph of every import in the
wheel's modules (at any depth: a function's lazy imports too), built with ast over its folders."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_product_boundary import import_source, product_modules


def import_graph() -> dict[str, set[str]]:
    """Each product module and the product modules it imports (a ``from X import y`` names the
    module ``X.y`` when there is one, else ``X``)."""
    modules = product_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(_longest_module(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = import_source(module, path, node)
                for alias in node.names:
                    found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def _longest_module(name: str, modules: dict[str, Path]) -> str:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return name


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's), each
    sorted: the modules that import one another round a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so that a long chain of imports cannot exhaust Python's recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_product_modules_import_one_another_without_a_circle():
    graph = import_graph()
    assert "amqpscope.jobs.cli.outcomes" in graph["amqpscope.jobs.cli.cli"]  # the graph holds lazy imports too:
    assert "amqpscope.jobs.cli.diagnose" in graph["amqpscope.jobs.cli.cli"]  # cli imports diagnose in a function
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# What each of jobs' packages may import of the others, as its docstring says: the engine nothing,
# the lake the engine, the report the lake (and what the lake may), the stages all but the command
# line, the command line all.
JOBS_LAYERS = {
    "engine": set(),
    "lake": {"engine"},
    "report": {"lake", "engine"},
    "stages": {"engine", "lake", "report"},
    "cli": {"engine", "lake", "report", "stages"},
}


def package_of(module: str) -> str | None:
    """The jobs package ``module`` is in (``amqpscope.jobs.lake.runs``: lake), None outside jobs'."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["amqpscope", "jobs"] else None


def crossings(graph: dict[str, set[str]], layers: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports (importer, imported) from one of jobs' packages into another that ``layers`` does
    not allow."""
    found = []
    for module, imported in sorted(graph.items()):
        here = package_of(module)
        if here is None:
            continue
        for other in sorted(imported):
            there = package_of(other)
            if there is not None and there != here and there not in layers[here]:
                found.append((module, other))
    return found


def test_jobs_packages_import_only_the_packages_their_docstrings_allow():
    graph = import_graph()
    assert {package_of(m) for m in graph} - {None} == set(JOBS_LAYERS)  # every package has its layer
    assert crossings(graph, JOBS_LAYERS) == []


def test_a_crossing_is_found():
    graph = {
        "amqpscope.jobs.lake.lake": {"amqpscope.jobs.stages.derive", "amqpscope.jobs.engine.session"},
        "amqpscope.jobs.engine.session": {"amqpscope.pipelines.tables"},
    }
    assert crossings(graph, JOBS_LAYERS) == [("amqpscope.jobs.lake.lake", "amqpscope.jobs.stages.derive")]
