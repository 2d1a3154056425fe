"""The packages are layers: each imports only those below it, nothing below ``service/`` imports
Flask, and no two modules import each other in a circle, not even for type checking only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["service", "sessions", "grading", "workspaces", "sandbox"]  # top to bottom
SHARED = {"config", "errors"}  # leaves every layer may import


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module a file imports (under ``if TYPE_CHECKING:`` and inside functions too),
    relative imports resolved; ``from pkg import name`` also counts ``pkg.name``."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def project_modules() -> dict[str, set[str]]:
    files = [
        *ROOT.joinpath("task_executor").rglob("*.py"),
        *ROOT.joinpath("sandbox_client").rglob("*.py"),
    ]
    names = {module_name(f): f for f in files if "reporter" not in f.parts}
    return {
        name: {m for m in imports_of(f) if m in names and m != name} for name, f in names.items()
    }


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return (
        parts[1] if len(parts) > 1 and parts[0] == "task_executor" and parts[1] in LAYERS else None
    )


def test_each_layer_imports_only_layers_below_it() -> None:
    wrong = []
    for module, deps in project_modules().items():
        mine = layer_of(module)
        if mine is None:
            continue
        for dep in deps:
            theirs = layer_of(dep)
            top = dep.split(".")[1] if dep.startswith("task_executor.") else None
            if theirs is not None and LAYERS.index(theirs) < LAYERS.index(mine):
                wrong.append(f"{module} imports {dep} (a layer above it)")
            elif dep.startswith("task_executor.") and theirs is None and top not in SHARED:
                if dep != "task_executor":
                    wrong.append(f"{module} imports {dep} (an entry point)")
    assert wrong == []


def test_nothing_below_service_imports_flask() -> None:
    files = [f for f in ROOT.joinpath("task_executor").rglob("*.py") if "service" not in f.parts]
    flaskish = [
        f"{module_name(f)} imports {m}"
        for f in files
        for m in imports_of(f)
        if m.split(".")[0] in {"flask", "werkzeug", "waitress"}
    ]
    assert flaskish == []


def test_no_import_cycle_not_even_a_type_only_one() -> None:
    graph = project_modules()

    # a package's __init__ re-exporting its modules is not a cycle with them
    def edges(module: str) -> set[str]:
        return {d for d in graph[module] if not module.startswith(d + ".")}

    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in edges(module):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


@pytest.mark.parametrize(
    "package", [*(f"task_executor.{name}" for name in LAYERS), "sandbox_client.cli"]
)
def test_every_package_says_what_it_owns_and_may_import(package: str) -> None:
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert "import" in doc and len(doc) > 150
