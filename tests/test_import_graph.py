"""The project's import graph, read from the source with ast: no import circle, and no arrow up the layers.

Layers, bottom up: schemas (the contract and its codec) imports nothing of the project; producers and processors
import schemas, not each other; simulate (the simulators and load generators) may import schemas and producers;
fleetprof (the CLI and what only it needs) may import everything. Imports inside functions count like those at the
top of a module. Imports under `if TYPE_CHECKING:` count for the layers but not for circles: they never run, so they
cannot make one at import time.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {  # package -> the packages it may import besides itself
    "schemas": set(),
    "producers": {"schemas"},
    "processors": {"schemas"},
    "simulate": {"schemas", "producers"},
    "fleetprof": {"schemas", "producers", "processors", "simulate"},
}
# The ELF symbol reader serves the agent, which publishes symbol tables, and the debuginfod symbol source of the
# symbolizer alike; where it belongs (below both) is still open.
SHARED_ACROSS = {
    ("processors.debuginfod", "producers.elf_symbols"),
}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the layered packages under root, by dotted name (a package by its own name)."""
    found = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_only: bool = False):
    """(import node, whether it sits under `if TYPE_CHECKING:`) for every import in the tree, at any depth."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), type_only)
        else:
            yield from _imports(node, type_only)


def import_graph(root: Path) -> dict[tuple[str, str], bool]:
    """Every arrow (importer, imported) between the project's modules; the value says whether the arrow only exists
    for type checking."""
    known = modules(root)

    def resolve(name: str) -> str | None:  # a.b.c names module a.b when c is an attribute of it
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    arrows: dict[tuple[str, str], bool] = {}
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, type_only in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{alias.name}" for alias in node.names]
            for name in names:
                target = resolve(name)
                if target is not None and target != module:
                    arrows[module, target] = arrows.get((module, target), True) and type_only
    return arrows


def circles(arrows: dict[tuple[str, str], bool]) -> list[list[str]]:
    """One circle through each group of modules that import each other (runtime arrows only), as a path that ends
    where it starts."""
    graph: dict[str, set[str]] = {}
    for (a, b), type_only in arrows.items():
        if not type_only:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {m: reach(m) for m in graph}
    found, done = [], set()
    for m in sorted(graph):
        group = {n for n in reached[m] if m in reached[n]}
        if m in done or len(group) < 2:
            continue
        done |= group
        came_from: dict[str, str] = {}  # breadth first from m until the walk is back at m: a shortest circle
        todo = deque([m])
        while m not in came_from:
            here = todo.popleft()
            for nxt in sorted(graph[here] & group):
                if nxt not in came_from:
                    came_from[nxt] = here
                    todo.append(nxt)
        path = [m]
        while len(path) == 1 or path[-1] != m:
            path.append(came_from[path[-1]])
        found.append(path[::-1])
    return found


def upward(arrows: dict[tuple[str, str], bool]) -> set[tuple[str, str]]:
    """Arrows from a package to one it may not import."""
    return {(a, b) for a, b in arrows
            if a.split(".")[0] != b.split(".")[0] and b.split(".")[0] not in LAYERS[a.split(".")[0]]}


ARROWS = import_graph(ROOT)


def test_no_import_circle():
    assert not circles(ARROWS), "import circles: " + "; ".join(" -> ".join(c) for c in circles(ARROWS))


def test_no_arrow_up_the_layers():
    wrong = sorted(upward(ARROWS) - SHARED_ACROSS)
    assert not wrong, "imports up or across the layers: " + ", ".join(f"{a} -> {b}" for a, b in wrong)


def test_the_listed_exceptions_are_still_needed():
    """An exception that no longer exists is removed from its list, so it cannot hide a new arrow."""
    assert SHARED_ACROSS <= upward(ARROWS)


def test_the_graph_sees_every_kind_of_import():
    assert ARROWS[("processors.messages", "schemas.single_object")] is False  # from schemas import single_object
    assert ("schemas.cpu_batch_reader", "schemas.cpu_batch_layout") in ARROWS  # from schemas.x import name
    assert ("fleetprof.local_pipeline", "fleetprof.api") in ARROWS  # inside a function
    assert ("fleetprof.cli", "fleetprof.commands") in ARROWS  # a package


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_and_an_upward_arrow_are_found(tmp_path: Path):
    _write(tmp_path, {
        "schemas/__init__.py": "",
        "schemas/a.py": "def f():\n    from schemas import b\n",
        "schemas/b.py": "from .c import x\n",
        "schemas/c.py": "import schemas.a\nx = 1\n",
        "producers/__init__.py": "",
        "producers/p.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from producers.q import Q\n",
        "producers/q.py": "from producers import p\n",
        "processors/__init__.py": "",
        "processors/s.py": "import fleetprof.cli\nfrom producers.p import thing\n",
        "fleetprof/__init__.py": "",
        "fleetprof/cli.py": "from schemas.a import f\n",
    })
    arrows = import_graph(tmp_path)
    assert circles(arrows) == [["schemas.a", "schemas.b", "schemas.c", "schemas.a"]]  # p <-> q is type-only
    assert arrows[("producers.p", "producers.q")] is True
    assert upward(arrows) == {("processors.s", "fleetprof.cli"), ("processors.s", "producers.p")}


def test_every_layered_package_is_read():
    assert {m.split(".")[0] for m in modules(ROOT)} == {p for p in LAYERS if (ROOT / p).is_dir()} >= {"schemas"}


# `fleetprof loadgen`, and `fleetprof up --simulate-gpu` (it starts the simulated GPU node)
RUNS_SIMULATORS = {"fleetprof.commands.loadgen", "fleetprof.commands.up"}


def test_only_the_commands_that_run_simulators_import_them():
    """Simulators stay apart from the production code: of the CLI, only the commands that exist to run them."""
    importers = {a for a, b in ARROWS if b.split(".")[0] == "simulate" and a.split(".")[0] != "simulate"}
    assert importers == RUNS_SIMULATORS
