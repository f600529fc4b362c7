"""The package's import graph, read from the source: the parts depend on each other the way the
architecture says (docs/explanation/architecture.md).

- Only the wiring's own entry points import the wiring (``pool/app.py``): every other part is
  handed what it needs, so none can reach through the service object.
- No circle: a part that imports another is not imported by it, directly or round about
  (imports inside functions count too: they are circles put off, not gone).
- The pure packages (the policy, GPU use, the dashboard's pages, the simulator) import nothing
  of the service (``pool/``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_gpushare"
WIRING = "jupyter_gpushare.pool.app"
# What runs the service: the entry points and the supervisor that starts it.
MAY_IMPORT_THE_WIRING = {"jupyter_gpushare.pool.__main__", "jupyter_gpushare.pool.supervisor"}
PURE = ("jupyter_gpushare.policy", "jupyter_gpushare.usage", "jupyter_gpushare.dashboard",
        "jupyter_gpushare.sim")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")
            if "migrations" not in p.parts and "labextension" not in p.parts}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # "from . import x" names a module x; "from .m import y" names module m
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def _without_package_inits(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` that re-exports its modules is not a circle with them."""
    return {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in edges.items()}


def test_only_the_service_entry_points_import_the_wiring():
    importers = {m for m, targets in graph().items() if WIRING in targets}
    assert importers <= MAY_IMPORT_THE_WIRING, \
        f"these reach the service object instead of being handed parts: {importers - MAY_IMPORT_THE_WIRING}"


def test_there_is_no_import_circle():
    edges = _without_package_inits(graph())
    circles, seen, on_path, order = [], set(), [], {}

    def visit(m):
        order[m] = len(on_path)
        on_path.append(m)
        for t in sorted(edges.get(m, ())):
            if t in order:
                circles.append(on_path[order[t]:] + [t])
            elif t not in seen:
                visit(t)
        on_path.pop()
        del order[m]
        seen.add(m)

    for m in sorted(edges):
        if m not in seen:
            visit(m)
    assert not circles, "import circles: " + "; ".join(" → ".join(c) for c in circles)


def test_the_pure_packages_import_nothing_of_the_service():
    wrong = {m: sorted(t for t in targets if t.startswith("jupyter_gpushare.pool"))
             for m, targets in graph().items() if m.startswith(PURE)}
    assert not {m: t for m, t in wrong.items() if t}
