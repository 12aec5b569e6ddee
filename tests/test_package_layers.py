"""The packages' layers, from their import statements: the CLI (fleetprof/) sits on top and producers/ and
processors/ never import it; the simulators (simulate/) stay out of the production packages, but for the CLI code
that exists to run them, and import no CLI or processor code themselves."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `fleetprof loadgen`, and `fleetprof up --simulate-gpu` (the local pipeline starts the simulated GPU node)
RUNS_SIMULATORS = {"fleetprof/commands/loadgen.py", "fleetprof/local_pipeline.py"}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports anywhere in it (absolute imports; relative ones stay inside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def importers(packages: tuple[str, ...], imported: str) -> set[str]:
    """Modules under `packages` that import the package `imported`, as paths from the repository root."""
    return {str(path.relative_to(ROOT)) for package in packages for path in sorted((ROOT / package).rglob("*.py"))
            if imported in imported_packages(path)}


def test_imported_packages_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os.path\nfrom . import sibling\n\ndef f():\n    from simulate.loadgen import run\n")
    assert imported_packages(module) == {"os", "simulate"}


def test_producers_and_processors_never_import_the_cli() -> None:
    assert importers(("producers", "processors"), "fleetprof") == set()


def test_only_the_code_that_runs_simulators_imports_them() -> None:
    assert importers(("fleetprof", "producers", "processors", "schemas"), "simulate") == RUNS_SIMULATORS


def test_simulators_import_no_cli_or_processor_code() -> None:
    assert importers(("simulate",), "fleetprof") | importers(("simulate",), "processors") == set()
